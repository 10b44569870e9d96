/* SPDX-License-Identifier: MIT */

/* pubsub: the post office of one process. It knows which sinks (the lanes
 * of a worker, or in the root: the root lane and the workers) have
 * subscribers for which channels and patterns, and hands each published
 * message to the sinks that want it. Thread-safe. */
#ifndef MP_PUBSUB_H
#define MP_PUBSUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A published message: channel and payload in one refcounted block, so one
 * copy serves every sink. */
typedef struct {
  _Atomic uint32_t refs;
  uint32_t flags; /* PUBSUB_* */
  size_t clen, mlen, plen;
  char data[]; /* channel bytes, message bytes, then (PUBSUB_PATTERN) the
                  pattern (not NUL-terminated) */
} pubsub_msg_t;

#define PUBSUB_JSON 1u    /* the payload is a JSON-encoded table */
/* For one subscription only (a copy Redis sent for it): the subscribers
 * of the exact channel, or of the one pattern carried in the message. */
#define PUBSUB_EXACT 2u
#define PUBSUB_PATTERN 4u

/* A new message with one reference, or NULL (ENOMEM). */
pubsub_msg_t *pubsub_msg_new(const char *ch, size_t clen, const char *msg,
                             size_t mlen, uint32_t flags);
/* The same, for the subscribers of pattern `pat` only (PUBSUB_PATTERN). */
pubsub_msg_t *pubsub_msg_new_for(const char *ch, size_t clen, const char *msg,
                                 size_t mlen, const char *pat, size_t plen,
                                 uint32_t flags);
static inline const char *pubsub_msg_pattern(const pubsub_msg_t *m) {
  return m->data + m->clen + m->mlen;
}
static inline const char *pubsub_msg_channel(const pubsub_msg_t *m) {
  return m->data;
}
static inline const char *pubsub_msg_body(const pubsub_msg_t *m) {
  return m->data + m->clen;
}
void pubsub_msg_ref(pubsub_msg_t *m);
void pubsub_msg_unref(pubsub_msg_t *m);

typedef struct pubsub pubsub_t;

/* Called for each sink that has a matching subscriber, outside the lock;
 * it borrows `m` (take a reference to keep it). */
typedef void (*pubsub_deliver_fn)(int sink, pubsub_msg_t *m, void *arg);

/* A post office for sinks 0..nsinks-1. NULL on ENOMEM. */
pubsub_t *pubsub_new(int nsinks, pubsub_deliver_fn deliver, void *arg);
void pubsub_free(pubsub_t *ps);

/* Counts one more subscriber of `sink` for a channel (or a glob pattern).
 * Returns 1 when it is the first in the whole post office, 0 otherwise,
 * or -ENOMEM. */
int pubsub_subscribe(pubsub_t *ps, int sink, const char *ch, size_t len,
                     bool pattern);
/* Counts one subscriber less. Returns 1 when it was the last in the whole
 * post office, 0 otherwise (also when there was none). */
int pubsub_unsubscribe(pubsub_t *ps, int sink, const char *ch, size_t len,
                       bool pattern);
/* A channel or pattern, for the calls below (called with the post
 * office's lock held: it must not call into it). */
typedef void (*pubsub_key_fn)(const char *key, size_t len, bool pattern,
                              void *arg);
/* Forgets every subscription of `sink` (a worker that died); gone (may be
 * NULL) is told of each channel or pattern that has no subscriber left. */
void pubsub_clear_sink(pubsub_t *ps, int sink, pubsub_key_fn gone,
                       void *arg);
/* Calls fn for every channel and pattern with a subscriber. */
void pubsub_each(pubsub_t *ps, pubsub_key_fn fn, void *arg);


/* Hands `m` to every sink (but `except1` and `except2`; -1 for none) that
 * has a subscriber whose channel is m's channel or whose pattern matches
 * it. Returns how many sinks got it. */
int pubsub_publish(pubsub_t *ps, pubsub_msg_t *m, int except1, int except2);

/* Whether `sink` has a subscriber for m's channel. */
bool pubsub_wants(pubsub_t *ps, int sink, const pubsub_msg_t *m);

#endif
