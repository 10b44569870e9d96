/* SPDX-License-Identifier: MIT */

/* shdict: the shared dictionary's store (see shdict.h): shards, each a
 * robust lock, a hash table, an LRU list and a buddy allocator, all inside
 * one MAP_SHARED mapping and all addressed by offsets. */
#include "core/shdict.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

/* Blocks are 2^order bytes, 64 (one cache line) to 1 MiB: the largest
 * block bounds one item, and a bigger one would only let a few huge items
 * crowd out everything else. */
#define SHD_MIN_ORDER 6
#define SHD_MAX_ORDER 20
#define SHD_ORDERS (SHD_MAX_ORDER + 1)

/* A block's first word: whether it is free or an item, and its order. A
 * value that is neither means damage. */
#define SHD_TAG_FREE 0x5FEE0000u
#define SHD_TAG_USED 0x5B5D0000u
#define SHD_TAG_MASK 0xFFFF0000u

/* The longest hash chain (shd_insert). */
#define SHD_CHAIN_MAX 32

#define SHD_MAGIC 0x6d70736864696374ull /* "mpshdict" */

/* The mapping's first 64 bytes. Written once by shdict_new, before any
 * other process exists; after that only read. */
typedef struct {
  uint64_t magic;
  uint64_t size;
  /* SipHash's key, random per dictionary: the same in every process (they
   * all map this segment), unknown to whoever chooses the keys */
  uint64_t key[2];
  uint32_t nshards;
  uint32_t shard_size;
  char name[24]; /* for a reader of a core dump */
} shd_hdr_t;
_Static_assert(sizeof(shd_hdr_t) == 64,
               "the header is the mapping's first 64 bytes");

/* A shard's mutable state, at the start of the shard. Every field but the
 * lock is guarded by the lock. */
typedef struct {
  pthread_mutex_t lock;
  /* Set while a change is under way, so whoever takes the lock from a
   * process that died here knows the shard may be half changed. */
  _Atomic uint32_t writing;
  /* Odd while the lock's holder may change the shard; bumped at every
   * lock and unlock, so a reader without the lock can tell whether what
   * it read stayed put (a seqlock). Written under the lock only. */
  _Atomic uint32_t seq;
  uint32_t lru_head, lru_tail; /* most and least recently used item */
  uint32_t free_head[SHD_ORDERS];
  uint64_t count;
  uint64_t free_bytes;
  uint64_t repairs;
} shd_shard_t;

typedef struct {
  uint32_t tag;
  uint32_t next, prev; /* a free list of its order */
} shd_free_t;

typedef struct {
  uint32_t tag;
  uint32_t hnext;      /* the next item of its hash bucket */
  uint32_t prev, next; /* LRU: towards the head, towards the tail */
  uint32_t hash;
  uint32_t klen;
  uint32_t vlen;
  uint32_t flags;
  uint64_t expires; /* monotonic ms; 0: never */
  uint8_t type;
  uint8_t ref; /* read since it was last put at the head (second chance) */
  uint8_t pad[6];
  /* key bytes, then value bytes */
} shd_item_t;

/* The handle: the geometry, copied out of the mapping once, so a damaged
 * mapping can't move a shard or its arena. */
struct shdict {
  uint8_t *base;
  size_t size;
  uint64_t key[2]; /* the header's hash key */
  uint32_t nshards;
  uint32_t shard_size;
  uint32_t nbuckets;   /* per shard, a power of two */
  uint32_t buckets_off; /* from the shard's start */
  uint32_t arena_off;
  uint32_t arena_end;
  uint32_t top;        /* the largest block's order */
  char name[SHDICT_MAX_NAME + 1];
};

/* One operation on one shard: `bad` is set when something read from the
 * mapping does not hold up, and the shard is reset before it is unlocked. */
typedef struct {
  const shdict_t *d;
  shd_shard_t *s;
  uint8_t *sb; /* the shard's first byte */
  uint32_t *buckets;
  bool bad;
  uint64_t now;
} shd_op_t;

/* ---- geometry ---- */

static uint64_t shd_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* SipHash-1-3 (Aumasson and Bernstein; one compression round per word,
 * three at the end, as Rust's and Python's hash tables use) of the key
 * under the dictionary's random 128-bit key: a keyed PRF, so no set of
 * keys collides whatever the key (the multiply-xorshift before let 2^k
 * keys of 16k bytes share one hash for every seed). */
#define SHD_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SHD_SIPROUND(v0, v1, v2, v3)                                           \
  do {                                                                         \
    v0 += v1;                                                                  \
    v1 = SHD_ROTL(v1, 13);                                                     \
    v1 ^= v0;                                                                  \
    v0 = SHD_ROTL(v0, 32);                                                     \
    v2 += v3;                                                                  \
    v3 = SHD_ROTL(v3, 16);                                                     \
    v3 ^= v2;                                                                  \
    v0 += v3;                                                                  \
    v3 = SHD_ROTL(v3, 21);                                                     \
    v3 ^= v0;                                                                  \
    v2 += v1;                                                                  \
    v1 = SHD_ROTL(v1, 17);                                                     \
    v1 ^= v2;                                                                  \
    v2 = SHD_ROTL(v2, 32);                                                     \
  } while (0)

static uint64_t shd_hash(const uint64_t key[2], const char *k, size_t n) {
  uint64_t v0 = key[0] ^ 0x736f6d6570736575ull;
  uint64_t v1 = key[1] ^ 0x646f72616e646f6dull;
  uint64_t v2 = key[0] ^ 0x6c7967656e657261ull;
  uint64_t v3 = key[1] ^ 0x7465646279746573ull;
  uint64_t b = (uint64_t)n << 56;
  const unsigned char *p = (const unsigned char *)k;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t m = 0;
    for (int i = 0; i < 8; i++) m |= (uint64_t)p[i] << (8 * i);
    v3 ^= m;
    SHD_SIPROUND(v0, v1, v2, v3);
    v0 ^= m;
  }
  /* the last 0..7 bytes without a loop (a loop of unknown count was a
   * fifth of a short key's hash) */
  switch (n) {
  case 7: b |= (uint64_t)p[6] << 48; /* fall through */
  case 6: b |= (uint64_t)p[5] << 40; /* fall through */
  case 5: b |= (uint64_t)p[4] << 32; /* fall through */
  case 4: b |= (uint64_t)p[3] << 24; /* fall through */
  case 3: b |= (uint64_t)p[2] << 16; /* fall through */
  case 2: b |= (uint64_t)p[1] << 8;  /* fall through */
  case 1: b |= (uint64_t)p[0]; break;
  default: break;
  }
  v3 ^= b;
  SHD_SIPROUND(v0, v1, v2, v3);
  v0 ^= b;
  v2 ^= 0xff;
  SHD_SIPROUND(v0, v1, v2, v3);
  SHD_SIPROUND(v0, v1, v2, v3);
  SHD_SIPROUND(v0, v1, v2, v3);
  return v0 ^ v1 ^ v2 ^ v3;
}

static uint32_t shd_order_for(size_t bytes) {
  uint32_t o = SHD_MIN_ORDER;
  while (((size_t)1 << o) < bytes) o++;
  return o;
}

static void *shd_at(shd_op_t *op, uint32_t off) { return op->sb + off; }

/* An item at off, if off and the item's header hold up. */
static bool shd_off_ok(const shdict_t *d, uint32_t off) {
  return off >= d->arena_off && off < d->arena_end &&
         !((off - d->arena_off) & 63);
}

/* Whether the item header `it` (read from off) holds up. */
static bool shd_hdr_ok(const shdict_t *d, uint32_t off, const shd_item_t *it) {
  uint32_t order = it->tag & ~SHD_TAG_MASK;
  return (it->tag & SHD_TAG_MASK) == SHD_TAG_USED && order >= SHD_MIN_ORDER &&
         order <= d->top && !((off - d->arena_off) & ((1u << order) - 1)) &&
         (uint64_t)off + (1u << order) <= d->arena_end && it->klen != 0 &&
         it->klen <= SHDICT_MAX_KEY &&
         sizeof(*it) + (uint64_t)it->klen + it->vlen <= (1u << order) &&
         it->type >= SHD_STR && it->type <= SHD_BOOL;
}

static shd_item_t *shd_item(shd_op_t *op, uint32_t off) {
  shd_item_t *it = shd_off_ok(op->d, off) ? shd_at(op, off) : NULL;
  if (!it || !shd_hdr_ok(op->d, off, it)) {
    op->bad = true;
    return NULL;
  }
  return it;
}

static char *shd_key(shd_item_t *it) { return (char *)(it + 1); }
static char *shd_val(shd_item_t *it) { return (char *)(it + 1) + it->klen; }

static bool shd_expired(shd_op_t *op, shd_item_t *it) {
  if (!it->expires) return false;
  if (!op->now) op->now = shd_now_ms();
  return it->expires <= op->now;
}

/* ---- the buddy allocator ---- */

static bool shd_free_ok(shd_op_t *op, uint32_t off, uint32_t order) {
  const shdict_t *d = op->d;
  if (off < d->arena_off || (uint64_t)off + (1u << order) > d->arena_end ||
      ((off - d->arena_off) & ((1u << order) - 1))) {
    op->bad = true;
    return false;
  }
  shd_free_t *f = shd_at(op, off);
  if (f->tag != (SHD_TAG_FREE | order)) {
    op->bad = true;
    return false;
  }
  return true;
}

static void shd_free_push(shd_op_t *op, uint32_t off, uint32_t order) {
  shd_shard_t *s = op->s;
  shd_free_t *f = shd_at(op, off);
  f->tag = SHD_TAG_FREE | order;
  f->prev = 0;
  f->next = s->free_head[order];
  if (f->next && shd_free_ok(op, f->next, order))
    ((shd_free_t *)shd_at(op, f->next))->prev = off;
  s->free_head[order] = off;
  s->free_bytes += 1u << order;
}

static void shd_free_remove(shd_op_t *op, uint32_t off, uint32_t order) {
  shd_shard_t *s = op->s;
  shd_free_t *f = shd_at(op, off);
  if (f->prev) {
    if (!shd_free_ok(op, f->prev, order)) return;
    ((shd_free_t *)shd_at(op, f->prev))->next = f->next;
  } else {
    s->free_head[order] = f->next;
  }
  if (f->next) {
    if (!shd_free_ok(op, f->next, order)) return;
    ((shd_free_t *)shd_at(op, f->next))->prev = f->prev;
  }
  f->tag = 0;
  s->free_bytes -= 1u << order;
}

/* A block of 2^order bytes (tagged used), or 0. */
static uint32_t shd_alloc(shd_op_t *op, uint32_t order) {
  shd_shard_t *s = op->s;
  uint32_t o = order;
  while (o <= op->d->top && !s->free_head[o]) o++;
  if (o > op->d->top) return 0;
  uint32_t off = s->free_head[o];
  if (!shd_free_ok(op, off, o)) return 0;
  shd_free_remove(op, off, o);
  while (o > order) { /* split: the upper half goes back as a free block */
    o--;
    shd_free_push(op, off + (1u << o), o);
  }
  ((shd_item_t *)shd_at(op, off))->tag = SHD_TAG_USED | order;
  return off;
}

static void shd_release(shd_op_t *op, uint32_t off, uint32_t order) {
  const shdict_t *d = op->d;
  while (order < d->top) {
    uint32_t buddy = d->arena_off + ((off - d->arena_off) ^ (1u << order));
    if ((uint64_t)buddy + (1u << order) > d->arena_end) break;
    shd_free_t *b = shd_at(op, buddy);
    if (b->tag != (SHD_TAG_FREE | order)) break;
    shd_free_remove(op, buddy, order);
    if (op->bad) return;
    if (buddy < off) off = buddy;
    order++;
  }
  shd_free_push(op, off, order);
}

/* Empties a shard: one free block per power of two the arena holds (the
 * largest as many times as it fits), no items. */
static void shd_reset(shd_op_t *op) {
  const shdict_t *d = op->d;
  shd_shard_t *s = op->s;
  memset(op->buckets, 0, (size_t)d->nbuckets * sizeof(uint32_t));
  memset(s->free_head, 0, sizeof(s->free_head));
  s->lru_head = s->lru_tail = 0;
  s->count = 0;
  s->free_bytes = 0;
  uint32_t off = d->arena_off;
  for (uint32_t o = d->top; o >= SHD_MIN_ORDER; o--)
    while ((uint64_t)off + (1u << o) <= d->arena_end) {
      shd_free_push(op, off, o);
      off += 1u << o;
      if (o < d->top) break; /* below the top, each size fits once */
    }
  op->bad = false;
}

/* ---- locking ---- */

static int shd_begin(const shdict_t *d, uint64_t h, shd_op_t *op) {
  uint32_t i = (uint32_t)(h >> 40) & (d->nshards - 1);
  op->d = d;
  op->sb = d->base + 64 + (size_t)i * d->shard_size;
  op->s = (shd_shard_t *)op->sb;
  op->buckets = (uint32_t *)(op->sb + d->buckets_off);
  op->bad = false;
  op->now = 0;
  int rc = pthread_mutex_lock(&op->s->lock);
  if (rc == EOWNERDEAD) {
    /* Its owner died holding it: the lock is ours; the state is whole
     * unless the owner was changing it. */
    pthread_mutex_consistent(&op->s->lock);
    op->s->repairs++;
    if (atomic_load_explicit(&op->s->writing, memory_order_relaxed))
      shd_reset(op);
    atomic_store_explicit(&op->s->writing, 0, memory_order_relaxed);
    rc = 0;
  }
  if (rc) return -EIO;
  /* Every operation may change the shard (a hit marks its item).
   * The compiler must not sink this store below those changes. */
  atomic_store_explicit(&op->s->writing, 1, memory_order_relaxed);
  /* Odd (it already is if a dead holder left it so), and ordered before
   * the changes for readers without the lock. */
  uint32_t q = atomic_load_explicit(&op->s->seq, memory_order_relaxed);
  if (!(q & 1)) atomic_store_explicit(&op->s->seq, q + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_signal_fence(memory_order_seq_cst);
  return 0;
}

/* Unlocks; rc, or -EIO if the shard turned out damaged (it is reset). */
static int shd_end(shd_op_t *op, int rc) {
  if (op->bad) {
    op->s->repairs++;
    shd_reset(op);
    rc = -EIO;
  }
  atomic_signal_fence(memory_order_seq_cst);
  atomic_store_explicit(&op->s->writing, 0, memory_order_relaxed);
  uint32_t q = atomic_load_explicit(&op->s->seq, memory_order_relaxed);
  atomic_store_explicit(&op->s->seq, q + 1, memory_order_release);
  pthread_mutex_unlock(&op->s->lock);
  return rc;
}

/* Locks shard i (shd_begin picks it from bits 40.. of the hash). */
static int shd_shard_op(const shdict_t *d, uint32_t i, shd_op_t *op) {
  return shd_begin(d, (uint64_t)i << 40, op);
}

/* ---- items ---- */

/* The live or expired item for key, or NULL. */
static shd_item_t *shd_find(shd_op_t *op, uint64_t h, const char *key,
                            size_t klen) {
  uint32_t off = op->buckets[h & (op->d->nbuckets - 1)];
  uint64_t steps = 0;
  while (off) {
    shd_item_t *it = shd_item(op, off);
    if (!it || ++steps > op->s->count) {
      op->bad = true;
      return NULL;
    }
    if (it->hash == (uint32_t)h && it->klen == klen &&
        memcmp(shd_key(it), key, klen) == 0)
      return it;
    off = it->hnext;
  }
  return NULL;
}

static uint32_t shd_off(shd_op_t *op, shd_item_t *it) {
  return (uint32_t)((uint8_t *)it - op->sb);
}

static void shd_lru_unlink(shd_op_t *op, shd_item_t *it) {
  shd_shard_t *s = op->s;
  if (it->prev) {
    shd_item_t *p = shd_item(op, it->prev);
    if (!p) return;
    p->next = it->next;
  } else {
    s->lru_head = it->next;
  }
  if (it->next) {
    shd_item_t *n = shd_item(op, it->next);
    if (!n) return;
    n->prev = it->prev;
  } else {
    s->lru_tail = it->prev;
  }
  it->prev = it->next = 0;
}

static void shd_lru_push(shd_op_t *op, shd_item_t *it) {
  shd_shard_t *s = op->s;
  uint32_t off = shd_off(op, it);
  it->prev = 0;
  it->next = s->lru_head;
  if (s->lru_head) {
    shd_item_t *h = shd_item(op, s->lru_head);
    if (!h) return;
    h->prev = off;
  } else {
    s->lru_tail = off;
  }
  s->lru_head = off;
}

static void shd_touch(shd_op_t *op, shd_item_t *it) {
  if (op->s->lru_head == shd_off(op, it)) return;
  shd_lru_unlink(op, it);
  if (!op->bad) shd_lru_push(op, it);
}

/* Takes an item out of its bucket and the LRU list and frees its block. */
static void shd_remove(shd_op_t *op, shd_item_t *it) {
  uint32_t off = shd_off(op, it);
  uint32_t *pp = &op->buckets[it->hash & (op->d->nbuckets - 1)];
  uint64_t steps = 0;
  while (*pp != off) {
    shd_item_t *x = *pp ? shd_item(op, *pp) : NULL;
    if (!x || ++steps > op->s->count) {
      op->bad = true;
      return;
    }
    pp = &x->hnext;
  }
  *pp = it->hnext;
  shd_lru_unlink(op, it);
  if (op->bad) return;
  op->s->count--;
  shd_release(op, off, it->tag & ~SHD_TAG_MASK);
}

static size_t shd_vlen(const shd_value_t *v) {
  return v->type == SHD_STR ? v->len : v->type == SHD_NUM ? sizeof(double) : 1;
}

static void shd_put_value(shd_item_t *it, const shd_value_t *v) {
  it->type = (uint8_t)v->type;
  it->flags = v->flags;
  it->vlen = (uint32_t)shd_vlen(v);
  if (v->type == SHD_STR)
    memcpy(shd_val(it), v->s, v->len);
  else if (v->type == SHD_NUM)
    memcpy(shd_val(it), &v->num, sizeof(double));
  else
    shd_val(it)[0] = v->num != 0;
}

static uint64_t shd_deadline(shd_op_t *op, double ttl) {
  if (ttl <= 0) return 0;
  if (!op->now) op->now = shd_now_ms();
  double ms = ceil(ttl * 1000);
  return op->now + (ms < 1 ? 1 : (uint64_t)ms);
}

/* A block of `order` for a new item, evicting from the LRU tail until one
 * is free. An item read since it was put at the head gets a second chance
 * (back to the head, unmarked) instead: reads only mark items, so a get
 * writes nothing but that mark, and the list order is that of the writes
 * with reads folded in at eviction time (CLOCK's approximation of LRU). */
static uint32_t shd_alloc_evict(shd_op_t *op, uint32_t order, bool *forcible) {
  uint32_t off;
  /* each item is passed over at most once, then evicted: a damaged list
   * can't loop for ever */
  uint64_t left = 2 * op->s->count + 1;
  while (!(off = shd_alloc(op, order)) && !op->bad && op->s->lru_tail) {
    if (left-- == 0) {
      op->bad = true;
      return 0;
    }
    shd_item_t *t = shd_item(op, op->s->lru_tail);
    if (!t) return 0;
    bool old = shd_expired(op, t);
    if (t->ref && !old) {
      t->ref = 0;
      shd_touch(op, t);
      continue;
    }
    if (!old) *forcible = true;
    shd_remove(op, t);
  }
  return op->bad ? 0 : off;
}

/* A new item for key with value v at the heads of its bucket and the LRU
 * list; -ENOMEM if no block can be had. */
static int shd_insert(shd_op_t *op, uint64_t h, const char *key, size_t klen,
                      const shd_value_t *v, uint64_t expires, bool *forcible) {
  /* Expired items at the tail go first: cheaper than evicting live ones
   * later. */
  for (int i = 0; i < 2 && op->s->lru_tail; i++) {
    shd_item_t *t = shd_item(op, op->s->lru_tail);
    if (!t || !shd_expired(op, t)) break;
    shd_remove(op, t);
  }
  if (op->bad) return -EIO;
  uint32_t order = shd_order_for(sizeof(shd_item_t) + klen + shd_vlen(v));
  uint32_t off = shd_alloc_evict(op, order, forcible);
  if (!off) return op->bad ? -EIO : -ENOMEM;
  shd_item_t *it = shd_at(op, off);
  it->klen = (uint32_t)klen;
  it->hash = (uint32_t)h;
  it->ref = 0;
  it->expires = expires;
  memcpy(shd_key(it), key, klen);
  shd_put_value(it, v);
  uint32_t *b = &op->buckets[h & (op->d->nbuckets - 1)];
  it->hnext = *b;
  *b = off;
  op->s->count++;
  shd_lru_push(op, it);
  /* A bucket holds SHD_CHAIN_MAX items at most: the oldest past that is
   * evicted, so no walk is longer whatever the keys (a random key makes a
   * chain that long all but impossible; this is the backstop). */
  uint32_t at = it->hnext;
  for (int n = 1; at && !op->bad; n++) {
    shd_item_t *x = shd_item(op, at);
    if (!x) {
      op->bad = true;
      break;
    }
    if (n == SHD_CHAIN_MAX) {
      if (!shd_expired(op, x)) *forcible = true;
      shd_remove(op, x);
      break;
    }
    at = x->hnext;
  }
  return op->bad ? -EIO : 0;
}

static int shd_check_key(const shdict_t *d, size_t klen) {
  if (klen == 0) return -EINVAL;
  if (klen > SHDICT_MAX_KEY) return -ENAMETOOLONG;
  return 0;
}

/* ---- the contract ---- */

shdict_t *shdict_new(const char *name, size_t size) {
  size_t nlen = name ? strlen(name) : 0;
  if (nlen == 0 || nlen > SHDICT_MAX_NAME || size < SHDICT_MIN_SIZE ||
      size > SHDICT_MAX_SIZE) {
    errno = EINVAL;
    return NULL;
  }
  size = (size + 4095) & ~(size_t)4095;
  /* A shard per 256 KiB, up to 64: enough locks that lanes and workers
   * rarely meet on one, and shards big enough that LRU order within a
   * shard is close to the dictionary's. */
  uint32_t nshards = 1;
  while (nshards < 64 && (size_t)nshards * 2 * (256u << 10) <= size)
    nshards *= 2;
  size_t shard_size = ((size - 64) / nshards) & ~(size_t)63;
  if (shard_size > (1ull << 31)) shard_size = 1ull << 31;
  shdict_t *d = calloc(1, sizeof(*d));
  if (!d) return NULL;
  uint8_t *base = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    free(d);
    return NULL;
  }
  d->base = base;
  d->size = size;
  d->nshards = nshards;
  d->shard_size = (uint32_t)shard_size;
  memcpy(d->name, name, nlen + 1);
  /* A dictionary without a random key is not made: a guessable one gives
   * the collisions back. */
  if (getrandom(d->key, sizeof(d->key), 0) != (ssize_t)sizeof(d->key)) {
    munmap(base, size);
    free(d);
    errno = EAGAIN;
    return NULL;
  }
  /* A bucket (4 bytes) per 256 bytes of arena: chains stay short for
   * items of a few dozen bytes, the table costs under 2 %. */
  size_t head = (sizeof(shd_shard_t) + 63) & ~(size_t)63;
  uint32_t nb = 16;
  while ((size_t)nb * 2 * 256 <= shard_size - head) nb *= 2;
  d->nbuckets = nb;
  d->buckets_off = (uint32_t)head;
  d->arena_off = (uint32_t)((head + (size_t)nb * 4 + 63) & ~(size_t)63);
  d->arena_end = (uint32_t)shard_size;
  uint32_t top = SHD_MIN_ORDER;
  while (top < SHD_MAX_ORDER &&
         (2ull << top) <= (uint64_t)d->arena_end - d->arena_off)
    top++;
  d->top = top;
  shd_hdr_t *hdr = (shd_hdr_t *)base;
  hdr->magic = SHD_MAGIC;
  hdr->size = size;
  memcpy(hdr->key, d->key, sizeof(hdr->key));
  hdr->nshards = nshards;
  hdr->shard_size = d->shard_size;
  snprintf(hdr->name, sizeof(hdr->name), "%s", name);

  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  for (uint32_t i = 0; i < nshards; i++) {
    shd_op_t op = {.d = d, .sb = base + 64 + (size_t)i * shard_size};
    op.s = (shd_shard_t *)op.sb;
    op.buckets = (uint32_t *)(op.sb + d->buckets_off);
    if (pthread_mutex_init(&op.s->lock, &a)) {
      pthread_mutexattr_destroy(&a);
      munmap(base, size);
      free(d);
      errno = ENOMEM;
      return NULL;
    }
    shd_reset(&op);
  }
  pthread_mutexattr_destroy(&a);
  return d;
}

void shdict_free(shdict_t *d) {
  if (!d) return;
  munmap(d->base, d->size);
  free(d);
}

const char *shdict_name(const shdict_t *d) { return d->name; }
size_t shdict_size(const shdict_t *d) { return d->size; }

size_t shdict_capacity(const shdict_t *d) {
  return (size_t)d->nshards * (d->arena_end - d->arena_off);
}

size_t shdict_max_item(const shdict_t *d) {
  return ((size_t)1 << d->top) - sizeof(shd_item_t);
}

/* The sum over the shards of the uint64_t field at `off` of their state,
 * each read under its shard's lock. */
static uint64_t shd_sum(shdict_t *d, size_t off) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < d->nshards; i++) {
    shd_op_t op;
    if (shd_shard_op(d, i, &op)) continue;
    uint64_t v;
    memcpy(&v, (const char *)op.s + off, sizeof(v));
    n += v;
    shd_end(&op, 0);
  }
  return n;
}

size_t shdict_free_space(shdict_t *d) {
  return (size_t)shd_sum(d, offsetof(shd_shard_t, free_bytes));
}

uint64_t shdict_repairs(shdict_t *d) {
  return shd_sum(d, offsetof(shd_shard_t, repairs));
}

/* A get without the lock: reads don't write the shard's cache lines, so
 * lanes and workers reading the same shard don't take its lines from each
 * other. The shard's seq must be even and the same before and after;
 * everything read in between is treated as untrusted (the header copied
 * once and checked, offsets bounded, chains cut short), because a writer
 * may be changing it. Returns false to ask for the locked path: a writer
 * kept changing it, something didn't hold up, or the item is not yet
 * marked used (marking needs the lock). Under TSan the locked path is
 * always taken: the racing reads are what the retries make safe, which
 * TSan can't know. */
#if defined(__SANITIZE_THREAD__)
#define SHD_OPTIMISTIC 0
#else
#define SHD_OPTIMISTIC 1
#endif

static bool shd_get_fast(const shdict_t *d, uint64_t h, const char *key,
                         size_t klen, bool stale, shd_value_t *out, char *buf,
                         size_t cap, bool *expired, int *rcp, uint64_t now_ms) {
  uint32_t i = (uint32_t)(h >> 40) & (d->nshards - 1);
  const uint8_t *sb = d->base + 64 + (size_t)i * d->shard_size;
  shd_shard_t *s = (shd_shard_t *)sb;
  const volatile uint32_t *buckets =
      (const volatile uint32_t *)(sb + d->buckets_off);
  for (int attempt = 0; attempt < 3; attempt++) {
    uint32_t s1 = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (s1 & 1) continue;
    bool lock = false, old = false;
    int rc = -ENOENT;
    uint32_t off = buckets[h & (d->nbuckets - 1)];
    for (int steps = 0; off; steps++) {
      shd_item_t hd;
      if (steps == 16 || !shd_off_ok(d, off)) {
        lock = true;
        break;
      }
      memcpy(&hd, sb + off, sizeof(hd));
      if (!shd_hdr_ok(d, off, &hd)) {
        lock = true;
        break;
      }
      const uint8_t *kp = sb + off + sizeof(hd);
      if (hd.hash != (uint32_t)h || hd.klen != klen || memcmp(kp, key, klen)) {
        off = hd.hnext;
        continue;
      }
      if (!hd.ref) {
        lock = true;
        break;
      }
      old = hd.expires && hd.expires <= (now_ms ? now_ms : shd_now_ms());
      if (old && !stale) break;
      const uint8_t *vp = kp + hd.klen;
      out->type = hd.type;
      out->flags = hd.flags;
      out->s = NULL;
      out->len = hd.vlen;
      if (hd.type == SHD_STR) {
        if (hd.vlen <= cap) {
          memcpy(buf, vp, hd.vlen);
          out->s = buf;
        }
      } else if (hd.type == SHD_NUM) {
        memcpy(&out->num, vp, sizeof(double));
      } else {
        out->num = vp[0] != 0;
      }
      rc = 0;
      break;
    }
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s->seq, memory_order_relaxed) != s1) continue;
    if (lock) return false;
    if (!rc && expired) *expired = old;
    *rcp = rc;
    return true;
  }
  return false;
}

int shdict_get(shdict_t *d, const char *key, size_t klen, bool stale,
               shd_value_t *out, char *buf, size_t cap, bool *expired) {
  int rc = shd_check_key(d, klen);
  if (rc) return rc == -EINVAL ? -ENOENT : rc;
  uint64_t h = shd_hash(d->key, key, klen);
  if (SHD_OPTIMISTIC &&
      shd_get_fast(d, h, key, klen, stale, out, buf, cap, expired, &rc, 0))
    return rc;
  shd_op_t op;
  if ((rc = shd_begin(d, h, &op))) return rc;
  shd_item_t *it = shd_find(&op, h, key, klen);
  bool old = it && shd_expired(&op, it);
  if (!it || (old && !stale)) return shd_end(&op, -ENOENT);
  if (expired) *expired = old;
  out->type = it->type;
  out->flags = it->flags;
  out->s = NULL;
  out->len = it->vlen;
  if (it->type == SHD_STR) {
    if (it->vlen <= cap) {
      memcpy(buf, shd_val(it), it->vlen);
      out->s = buf;
    }
  } else if (it->type == SHD_NUM) {
    memcpy(&out->num, shd_val(it), sizeof(double));
  } else {
    out->num = shd_val(it)[0] != 0;
  }
  if (!it->ref) it->ref = 1; /* a use, for eviction (no list change) */
  return shd_end(&op, 0);
}

int shdict_store(shdict_t *d, int op_kind, const char *key, size_t klen,
                 const shd_value_t *v, double ttl, bool *forcible) {
  *forcible = false;
  int rc = shd_check_key(d, klen);
  if (rc) return rc;
  if (v->type != SHD_NIL &&
      klen + shd_vlen(v) > shdict_max_item(d))
    return -E2BIG;
  uint64_t h = shd_hash(d->key, key, klen);
  shd_op_t op;
  if ((rc = shd_begin(d, h, &op))) return rc;
  shd_item_t *it = shd_find(&op, h, key, klen);
  bool live = it && !shd_expired(&op, it);
  if (op.bad) return shd_end(&op, 0);
  if (op_kind == SHD_ADD && live) return shd_end(&op, -EEXIST);
  if (op_kind == SHD_REPLACE && !live) return shd_end(&op, -ENOENT);
  if (v->type == SHD_NIL) {
    if (it) shd_remove(&op, it);
    return shd_end(&op, 0);
  }
  uint64_t expires = shd_deadline(&op, ttl);
  uint32_t order = shd_order_for(sizeof(shd_item_t) + klen + shd_vlen(v));
  if (it && (it->tag & ~SHD_TAG_MASK) == order) { /* same block: in place */
    shd_put_value(it, v);
    it->expires = expires;
    it->ref = 0;
    shd_touch(&op, it);
    return shd_end(&op, 0);
  }
  if (it) shd_remove(&op, it);
  if (op.bad) return shd_end(&op, 0);
  return shd_end(&op, shd_insert(&op, h, key, klen, v, expires, forcible));
}

int shdict_incr(shdict_t *d, const char *key, size_t klen, double n,
                const double *init, double init_ttl, double *out,
                bool *forcible) {
  *forcible = false;
  int rc = shd_check_key(d, klen);
  if (rc) return rc;
  uint64_t h = shd_hash(d->key, key, klen);
  shd_op_t op;
  if ((rc = shd_begin(d, h, &op))) return rc;
  shd_item_t *it = shd_find(&op, h, key, klen);
  if (it && !shd_expired(&op, it)) {
    if (it->type != SHD_NUM) return shd_end(&op, -EINVAL);
    double x;
    memcpy(&x, shd_val(it), sizeof(x));
    x += n;
    memcpy(shd_val(it), &x, sizeof(x));
    *out = x;
    if (!it->ref) it->ref = 1; /* counters are hot: mark, don't move */
    return shd_end(&op, 0);
  }
  if (op.bad) return shd_end(&op, 0);
  if (!init) return shd_end(&op, -ENOENT);
  if (it) shd_remove(&op, it);
  if (op.bad) return shd_end(&op, 0);
  shd_value_t v = {.type = SHD_NUM, .num = *init + n};
  rc = shd_insert(&op, h, key, klen, &v, shd_deadline(&op, init_ttl),
                  forcible);
  if (!rc) *out = v.num;
  return shd_end(&op, rc);
}

int shdict_gcra(shdict_t *d, const char *key, size_t klen, double now_us,
                double interval_us, double tolerance_us, double n,
                double *wait_us, bool *forcible) {
  *forcible = false;
  *wait_us = 0;
  int rc = shd_check_key(d, klen);
  if (rc) return rc;
  uint64_t h = shd_hash(d->key, key, klen);
  /* One clock for the whole decision (the expiry checks and the deadline
   * reuse it), as each read costs as much as the rest of it: the caller's
   * (a loop's, read once per iteration) or one read here. A clock that
   * lags another lane's only makes a decision stricter (the time stored
   * is the later of the two), except on a key idle past its time, whose
   * budget then restarts from the lagging now. */
  double now = now_us;
  if (!(now >= 0)) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
  }
  uint64_t now_ms = (uint64_t)(now / 1e3);
  if (!now_ms) now_ms = 1;
  /* A rejection changes nothing, so it needs no lock: a time read
   * consistently without it (the seqlock read of shd_get_fast) that
   * rejects is as good as one read under the lock, since a stored time
   * only moves forward while it is live. Most decisions under an attack
   * are rejections, and this keeps them off the shard's lock and its
   * cache line. A pass, or anything unclear, takes the lock below. */
  shd_value_t fv;
  bool fexp;
  int frc;
  if (SHD_OPTIMISTIC &&
      shd_get_fast(d, h, key, klen, false, &fv, NULL, 0, &fexp, &frc, now_ms) &&
      frc == 0 && fv.type == SHD_NUM) {
    double tat = fv.num < now ? now : fv.num;
    double over = tat + n * interval_us - now - (tolerance_us + interval_us);
    if (over > 0) {
      *wait_us = over;
      return 0;
    }
  }
  shd_op_t op;
  if ((rc = shd_begin(d, h, &op))) return rc;
  op.now = now_ms;
  shd_item_t *it = shd_find(&op, h, key, klen);
  double tat = now;
  if (it && !shd_expired(&op, it)) {
    if (it->type != SHD_NUM) return shd_end(&op, -EINVAL);
    memcpy(&tat, shd_val(it), sizeof(tat));
    if (tat < now) tat = now;
  }
  if (op.bad) return shd_end(&op, 0);
  double next = tat + n * interval_us;
  double over = next - now - (tolerance_us + interval_us);
  if (over > 0) { /* rejected: nothing changes */
    *wait_us = over;
    return shd_end(&op, 0);
  }
  *wait_us = tat - now; /* what a conforming (delayed) pass would wait */
  double ttl = (next - now) / 1e6;
  if (it && !shd_expired(&op, it)) {
    memcpy(shd_val(it), &next, sizeof(next));
    it->expires = shd_deadline(&op, ttl);
    if (!it->ref) it->ref = 1;
    return shd_end(&op, 1);
  }
  if (it) shd_remove(&op, it);
  if (op.bad) return shd_end(&op, 0);
  shd_value_t v = {.type = SHD_NUM, .num = next};
  rc = shd_insert(&op, h, key, klen, &v, shd_deadline(&op, ttl), forcible);
  return shd_end(&op, rc ? rc : 1);
}

int shdict_delete(shdict_t *d, const char *key, size_t klen) {
  shd_value_t nil = {.type = SHD_NIL};
  bool f;
  int rc = shdict_store(d, SHD_SET, key, klen, &nil, 0, &f);
  return rc == -EINVAL ? 0 : rc;
}

int shdict_ttl(shdict_t *d, const char *key, size_t klen, double *left) {
  int rc = shd_check_key(d, klen);
  if (rc) return -ENOENT;
  uint64_t h = shd_hash(d->key, key, klen);
  shd_op_t op;
  if ((rc = shd_begin(d, h, &op))) return rc;
  shd_item_t *it = shd_find(&op, h, key, klen);
  if (!it || shd_expired(&op, it)) return shd_end(&op, -ENOENT);
  *left = it->expires ? (double)(it->expires - op.now) / 1000 : 0;
  return shd_end(&op, 0);
}

int shdict_expire(shdict_t *d, const char *key, size_t klen, double ttl) {
  int rc = shd_check_key(d, klen);
  if (rc) return -ENOENT;
  uint64_t h = shd_hash(d->key, key, klen);
  shd_op_t op;
  if ((rc = shd_begin(d, h, &op))) return rc;
  shd_item_t *it = shd_find(&op, h, key, klen);
  if (!it || shd_expired(&op, it)) return shd_end(&op, -ENOENT);
  it->expires = shd_deadline(&op, ttl);
  return shd_end(&op, 0);
}

char *shdict_keys(shdict_t *d, size_t max, size_t *n) {
  char *buf = NULL;
  size_t len = 0, cap = 0;
  *n = 0;
  for (uint32_t i = 0; i < d->nshards && (!max || *n < max); i++) {
    shd_op_t op;
    if (shd_shard_op(d, i, &op)) continue;
    uint32_t off = op.s->lru_head;
    uint64_t steps = 0;
    while (off && (!max || *n < max)) {
      shd_item_t *it = shd_item(&op, off);
      if (!it || ++steps > op.s->count) {
        op.bad = true;
        break;
      }
      off = it->next;
      if (shd_expired(&op, it)) continue;
      if (len + 4 + it->klen > cap) {
        size_t nc = cap ? cap * 2 : 4096;
        while (nc < len + 4 + it->klen) nc *= 2;
        char *nb = realloc(buf, nc);
        if (!nb) {
          shd_end(&op, 0);
          free(buf);
          *n = 0;
          errno = ENOMEM;
          return NULL;
        }
        buf = nb;
        cap = nc;
      }
      uint32_t kl = it->klen;
      memcpy(buf + len, &kl, 4);
      memcpy(buf + len + 4, shd_key(it), kl);
      len += 4 + kl;
      ++*n;
    }
    shd_end(&op, 0);
  }
  return buf;
}

void shdict_flush_all(shdict_t *d) {
  for (uint32_t i = 0; i < d->nshards; i++) {
    shd_op_t op;
    if (shd_shard_op(d, i, &op)) continue;
    shd_reset(&op);
    shd_end(&op, 0);
  }
}

size_t shdict_flush_expired(shdict_t *d, size_t max) {
  size_t gone = 0;
  for (uint32_t i = 0; i < d->nshards && (!max || gone < max); i++) {
    shd_op_t op;
    if (shd_shard_op(d, i, &op)) continue;
    uint32_t off = op.s->lru_tail;
    uint64_t steps = 0, limit = op.s->count;
    while (off && !op.bad && (!max || gone < max)) {
      shd_item_t *it = shd_item(&op, off);
      if (!it || ++steps > limit) {
        op.bad = true;
        break;
      }
      off = it->prev;
      if (!shd_expired(&op, it)) continue;
      shd_remove(&op, it);
      gone++;
    }
    shd_end(&op, 0);
  }
  return gone;
}

/* ---- for the unit tests ---- */

int shdict__hold(shdict_t *d, const char *key, size_t klen, bool writing) {
  shd_op_t op;
  int rc = shd_begin(d, shd_hash(d->key, key, klen), &op);
  if (!rc && !writing)
    atomic_store_explicit(&op.s->writing, 0, memory_order_relaxed);
  return rc;
}

uint32_t shdict__shard(const shdict_t *d, const char *key, size_t klen) {
  return (uint32_t)(shd_hash(d->key, key, klen) >> 40) & (d->nshards - 1);
}

void shdict__damage(shdict_t *d, uint32_t seed) {
  for (uint32_t i = 0; i < d->nshards; i++) {
    uint8_t *sb = d->base + 64 + (size_t)i * d->shard_size;
    size_t from = offsetof(shd_shard_t, lru_head);
    for (size_t k = from; k < d->shard_size; k++) {
      seed = seed * 1103515245u + 12345u;
      /* Mostly small numbers, so some offsets land inside the shard. */
      sb[k] = (uint8_t)(seed >> 16) & ((seed >> 29) ? 0xff : 0x07);
    }
  }
}
