/* SPDX-License-Identifier: MIT */

/* shdict: a key/value dictionary in one shared memory mapping, used by
 * every thread of every process that inherits it (mp.shared).
 *
 * Threads and processes: shdict_new maps MAP_SHARED | MAP_ANONYMOUS memory,
 * so a process forked after it sees the same bytes; every other function
 * may be called from any thread of any of those processes at once. The
 * mapping is split into shards (by the key's hash), each with its own
 * process-shared robust mutex, hash table, LRU list and buddy allocator.
 * Everything inside the mapping is an offset from its shard, never a
 * pointer, so nothing depends on where the mapping sits.
 *
 * A process that dies holding a shard's lock (kill -9) does not block the
 * others: the next locker gets EOWNERDEAD, and if the dead one was in the
 * middle of a change, that shard's items are dropped (the store is a
 * cache; a half-made change is never followed). A damaged item found on
 * the way (an offset out of bounds, a bad tag) also resets its shard.
 *
 * Errors: 0 or a negative errno. -ENOENT missing (or expired), -EEXIST
 * (add), -ENOMEM (the item can't fit even after evicting), -E2BIG (key +
 * value larger than shdict_max_item), -ENAMETOOLONG (key over
 * SHDICT_MAX_KEY), -EINVAL (empty key; incr of a value that is not a
 * number), -EIO (a shard was found damaged and reset). No function
 * allocates except shdict_new and shdict_keys. */
#ifndef MP_SHDICT_H
#define MP_SHDICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHDICT_MAX_KEY 4096
#define SHDICT_MAX_NAME 63
#define SHDICT_MIN_SIZE (8u << 10)
#define SHDICT_MAX_SIZE (16ull << 30)

typedef struct shdict shdict_t;

/* A value's type. SHD_NIL only as a store's value: delete. */
enum { SHD_NIL = 0, SHD_STR, SHD_NUM, SHD_BOOL };

typedef struct {
  int type;
  const char *s; /* SHD_STR: the bytes (borrowed) */
  size_t len;    /* SHD_STR: their length */
  double num;    /* SHD_NUM; SHD_BOOL: 0 or 1 */
  uint32_t flags;
} shd_value_t;

/* Maps a new dictionary of `size` bytes in all (SHDICT_MIN_SIZE to
 * SHDICT_MAX_SIZE; shard headers and hash tables come out of it) named
 * `name` (at most SHDICT_MAX_NAME bytes, kept for shdict_name). NULL with
 * errno set (EINVAL for a bad size or name). The handle is the caller's
 * (shdict_free); a forked child's copy of the handle is valid in it. */
shdict_t *shdict_new(const char *name, size_t size);
/* Unmaps this process's view. Other processes keep theirs. */
void shdict_free(shdict_t *d);

const char *shdict_name(const shdict_t *d);
/* The size given to shdict_new. */
size_t shdict_size(const shdict_t *d);
/* Bytes for items (the shards' arenas), and how many of them are free. */
size_t shdict_capacity(const shdict_t *d);
size_t shdict_free_space(shdict_t *d);
/* The largest key + value one item can hold. */
size_t shdict_max_item(const shdict_t *d);
/* How many times a shard was reset after a dead owner or damage. */
uint64_t shdict_repairs(shdict_t *d);

/* Looks key up. Found: returns 0 and fills *out; a string is copied into
 * buf when out->len <= cap (out->s = buf), otherwise out->s is NULL and the
 * caller retries with a buffer of out->len bytes. stale: an expired item
 * that is still there counts too (*expired says which). -ENOENT if not
 * there. A hit counts as a use for the LRU. */
int shdict_get(shdict_t *d, const char *key, size_t klen, bool stale,
               shd_value_t *out, char *buf, size_t cap, bool *expired);

/* Stores (set), stores only if missing (add: -EEXIST otherwise) or only if
 * present (replace: -ENOENT otherwise). ttl in seconds, 0: never expires.
 * A SHD_NIL value deletes (set only). Full: least recently used items of
 * the key's shard are evicted until it fits; *forcible says whether an
 * item that had not expired went. */
enum { SHD_SET = 0, SHD_ADD, SHD_REPLACE };
int shdict_store(shdict_t *d, int op, const char *key, size_t klen,
                 const shd_value_t *v, double ttl, bool *forcible);

/* Adds n to the number at key and puts the sum in *out. Missing: -ENOENT,
 * unless init is given, then the item is made as *init + n with init_ttl
 * (seconds, 0: never). -EINVAL if the value is not a number. */
int shdict_incr(shdict_t *d, const char *key, size_t klen, double n,
                const double *init, double init_ttl, double *out,
                bool *forcible);

/* 0 (whether or not key was there). */
int shdict_delete(shdict_t *d, const char *key, size_t klen);
/* One decision of the generic cell rate algorithm (mp.limit) on the
 * theoretical arrival time stored at key (a number, microseconds of
 * CLOCK_MONOTONIC), in one locked step: n units pass when the time they
 * push it to is at most tolerance_us + interval_us ahead of now (so
 * tolerance / interval + 1 pass at one instant, as nginx's limit_req
 * burst). Returns 1 (passed: the time is stored, expiring when it is
 * reached; *wait_us is how far ahead of now it was, what a caller that
 * delays instead of bursting waits), 0 (rejected, nothing stored;
 * *wait_us until n would pass) or a negative errno (-EINVAL: key holds
 * something else). now_us is the caller's reading of CLOCK_MONOTONIC in
 * microseconds (a loop's cached clock), or < 0 to read it here. A
 * rejection takes no lock where the shard can be read without it. Any
 * thread. */
int shdict_gcra(shdict_t *d, const char *key, size_t klen, double now_us,
                double interval_us, double tolerance_us, double n,
                double *wait_us, bool *forcible);
/* Seconds left before key expires (0: never), or -ENOENT. */
int shdict_ttl(shdict_t *d, const char *key, size_t klen, double *left);
/* Sets key's time to live (seconds, 0: never), or -ENOENT. */
int shdict_expire(shdict_t *d, const char *key, size_t klen, double ttl);

/* A malloc'ed block of up to max keys (0: all) that have not expired:
 * *n of them, each a uint32_t length and that many bytes, packed. NULL
 * with *n 0 for none or out of memory (errno ENOMEM then). Takes each
 * shard's lock in turn, so it is a snapshot per shard, not overall. */
char *shdict_keys(shdict_t *d, size_t max, size_t *n);
/* Drops every item. */
void shdict_flush_all(shdict_t *d);
/* Drops up to max expired items (0: all); returns how many went. */
size_t shdict_flush_expired(shdict_t *d, size_t max);

/* For the unit tests only. shdict__hold locks key's shard (marked as
 * being changed when `writing`) and returns without unlocking: a process
 * that then dies leaves the lock to the robust-mutex repair. shdict__shard
 * says which shard a key is in. shdict__damage overwrites every shard's
 * state but its lock (lists, tables, items) with bytes from `seed`. */
int shdict__hold(shdict_t *d, const char *key, size_t klen, bool writing);
uint32_t shdict__shard(const shdict_t *d, const char *key, size_t klen);
void shdict__damage(shdict_t *d, uint32_t seed);

#endif
