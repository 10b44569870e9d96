/* SPDX-License-Identifier: MIT */

/* pubsub: subscriptions counted per sink, exact channels in a hash table,
 * patterns in a list, one mutex. */
#include "cluster/pubsub.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/glob.h"

pubsub_msg_t *pubsub_msg_new_for(const char *ch, size_t clen, const char *msg,
                                 size_t mlen, const char *pat, size_t plen,
                                 uint32_t flags) {
  pubsub_msg_t *m = malloc(sizeof(*m) + clen + mlen + plen);
  if (!m) return NULL;
  atomic_init(&m->refs, 1);
  m->flags = flags;
  m->clen = clen;
  m->mlen = mlen;
  m->plen = plen;
  memcpy(m->data, ch, clen);
  if (mlen) memcpy(m->data + clen, msg, mlen);
  if (plen) memcpy(m->data + clen + mlen, pat, plen);
  return m;
}

pubsub_msg_t *pubsub_msg_new(const char *ch, size_t clen, const char *msg,
                             size_t mlen, uint32_t flags) {
  return pubsub_msg_new_for(ch, clen, msg, mlen, NULL, 0,
                            flags & ~(uint32_t)PUBSUB_PATTERN);
}

void pubsub_msg_ref(pubsub_msg_t *m) {
  atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
}

void pubsub_msg_unref(pubsub_msg_t *m) {
  if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1)
    free(m);
}

typedef struct entry {
  struct entry *next; /* hash chain, or the pattern list */
  bool pattern;
  int total;     /* subscribers over all sinks */
  int *per_sink; /* subscribers per sink */
  size_t len;
  char key[];
} entry_t;

/* All fields guarded by `lock`. */
struct pubsub {
  pthread_mutex_t lock;
  int nsinks;
  pubsub_deliver_fn deliver;
  void *arg;
  entry_t **buckets;
  size_t nbuckets, nexact;
  entry_t *patterns;
};

static uint64_t pubsub__hash(const char *s, size_t len) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ull;
  }
  return h;
}

pubsub_t *pubsub_new(int nsinks, pubsub_deliver_fn deliver, void *arg) {
  pubsub_t *ps = calloc(1, sizeof(*ps));
  if (!ps) return NULL;
  ps->nbuckets = 64;
  ps->buckets = calloc(ps->nbuckets, sizeof(*ps->buckets));
  if (!ps->buckets) {
    free(ps);
    return NULL;
  }
  pthread_mutex_init(&ps->lock, NULL);
  ps->nsinks = nsinks;
  ps->deliver = deliver;
  ps->arg = arg;
  return ps;
}

static void pubsub__free_list(entry_t *e) {
  while (e) {
    entry_t *next = e->next;
    free(e->per_sink);
    free(e);
    e = next;
  }
}

void pubsub_free(pubsub_t *ps) {
  if (!ps) return;
  for (size_t i = 0; i < ps->nbuckets; i++) pubsub__free_list(ps->buckets[i]);
  pubsub__free_list(ps->patterns);
  free(ps->buckets);
  pthread_mutex_destroy(&ps->lock);
  free(ps);
}

/* The list an entry lives on. Lock held. */
static entry_t **pubsub__list(pubsub_t *ps, const char *k, size_t len,
                              bool pattern) {
  if (pattern) return &ps->patterns;
  return &ps->buckets[pubsub__hash(k, len) & (ps->nbuckets - 1)];
}

static entry_t **pubsub__find(pubsub_t *ps, const char *k, size_t len,
                              bool pattern) {
  entry_t **pp = pubsub__list(ps, k, len, pattern);
  while (*pp && !((*pp)->len == len && memcmp((*pp)->key, k, len) == 0))
    pp = &(*pp)->next;
  return pp;
}

/* Doubles the exact table when it gets crowded. Lock held. */
static void pubsub__grow(pubsub_t *ps) {
  size_t n = ps->nbuckets * 2;
  entry_t **b = calloc(n, sizeof(*b));
  if (!b) return; /* stays correct, only slower */
  for (size_t i = 0; i < ps->nbuckets; i++) {
    for (entry_t *e = ps->buckets[i], *next; e; e = next) {
      next = e->next;
      entry_t **slot = &b[pubsub__hash(e->key, e->len) & (n - 1)];
      e->next = *slot;
      *slot = e;
    }
  }
  free(ps->buckets);
  ps->buckets = b;
  ps->nbuckets = n;
}

int pubsub_subscribe(pubsub_t *ps, int sink, const char *ch, size_t len,
                     bool pattern) {
  if (sink < 0 || sink >= ps->nsinks) return -EINVAL;
  pthread_mutex_lock(&ps->lock);
  entry_t **pp = pubsub__find(ps, ch, len, pattern);
  entry_t *e = *pp;
  if (!e) {
    e = calloc(1, sizeof(*e) + len);
    int *per = e ? calloc((size_t)ps->nsinks, sizeof(*per)) : NULL;
    if (!per) {
      free(e);
      pthread_mutex_unlock(&ps->lock);
      return -ENOMEM;
    }
    e->per_sink = per;
    e->pattern = pattern;
    e->len = len;
    memcpy(e->key, ch, len);
    *pp = e;
    if (!pattern && ++ps->nexact > ps->nbuckets) pubsub__grow(ps);
  }
  e->per_sink[sink]++;
  int first = e->total++ == 0;
  pthread_mutex_unlock(&ps->lock);
  return first;
}

/* Unlinks and frees an entry nobody subscribes to. Lock held. */
static void pubsub__drop(pubsub_t *ps, entry_t **pp) {
  entry_t *e = *pp;
  *pp = e->next;
  if (!e->pattern) ps->nexact--;
  free(e->per_sink);
  free(e);
}

int pubsub_unsubscribe(pubsub_t *ps, int sink, const char *ch, size_t len,
                       bool pattern) {
  if (sink < 0 || sink >= ps->nsinks) return 0;
  pthread_mutex_lock(&ps->lock);
  entry_t **pp = pubsub__find(ps, ch, len, pattern);
  int last = 0;
  if (*pp && (*pp)->per_sink[sink] > 0) {
    (*pp)->per_sink[sink]--;
    if (--(*pp)->total == 0) {
      pubsub__drop(ps, pp);
      last = 1;
    }
  }
  pthread_mutex_unlock(&ps->lock);
  return last;
}

static void pubsub__clear_list(pubsub_t *ps, entry_t **pp, int sink,
                               pubsub_key_fn gone, void *arg) {
  while (*pp) {
    entry_t *e = *pp;
    e->total -= e->per_sink[sink];
    e->per_sink[sink] = 0;
    if (e->total == 0) {
      if (gone) gone(e->key, e->len, e->pattern, arg);
      pubsub__drop(ps, pp);
    } else {
      pp = &e->next;
    }
  }
}

void pubsub_clear_sink(pubsub_t *ps, int sink, pubsub_key_fn gone,
                       void *arg) {
  if (sink < 0 || sink >= ps->nsinks) return;
  pthread_mutex_lock(&ps->lock);
  for (size_t i = 0; i < ps->nbuckets; i++)
    pubsub__clear_list(ps, &ps->buckets[i], sink, gone, arg);
  pubsub__clear_list(ps, &ps->patterns, sink, gone, arg);
  pthread_mutex_unlock(&ps->lock);
}

void pubsub_each(pubsub_t *ps, pubsub_key_fn fn, void *arg) {
  pthread_mutex_lock(&ps->lock);
  for (size_t i = 0; i < ps->nbuckets; i++)
    for (entry_t *e = ps->buckets[i]; e; e = e->next)
      fn(e->key, e->len, false, arg);
  for (entry_t *e = ps->patterns; e; e = e->next) fn(e->key, e->len, true, arg);
  pthread_mutex_unlock(&ps->lock);
}



/* Marks in `want` the sinks with a subscriber for m. Lock held. */
static void pubsub__match(pubsub_t *ps, const pubsub_msg_t *m, bool *want) {
  entry_t *e;
  if (m->flags & PUBSUB_PATTERN) { /* that pattern's subscribers only */
    e = *pubsub__find(ps, pubsub_msg_pattern(m), m->plen, true);
    if (e)
      for (int i = 0; i < ps->nsinks; i++) want[i] |= e->per_sink[i] > 0;
    return;
  }
  e = *pubsub__find(ps, m->data, m->clen, false);
  if (e)
    for (int i = 0; i < ps->nsinks; i++) want[i] |= e->per_sink[i] > 0;
  if (m->flags & PUBSUB_EXACT) return;
  for (e = ps->patterns; e; e = e->next) {
    if (!glob_match(e->key, e->len, m->data, m->clen)) continue;
    for (int i = 0; i < ps->nsinks; i++) want[i] |= e->per_sink[i] > 0;
  }
}

int pubsub_publish(pubsub_t *ps, pubsub_msg_t *m, int except1, int except2) {
  bool stack[64], *want = ps->nsinks <= 64 ? stack : calloc((size_t)ps->nsinks, 1);
  if (!want) return 0;
  memset(want, 0, (size_t)ps->nsinks);
  pthread_mutex_lock(&ps->lock);
  pubsub__match(ps, m, want);
  pthread_mutex_unlock(&ps->lock);
  int n = 0;
  for (int i = 0; i < ps->nsinks; i++) {
    if (!want[i] || i == except1 || i == except2) continue;
    ps->deliver(i, m, ps->arg);
    n++;
  }
  if (want != stack) free(want);
  return n;
}

bool pubsub_wants(pubsub_t *ps, int sink, const pubsub_msg_t *m) {
  if (sink < 0 || sink >= ps->nsinks) return false;
  bool stack[64], *want = ps->nsinks <= 64 ? stack : calloc((size_t)ps->nsinks, 1);
  if (!want) return false;
  memset(want, 0, (size_t)ps->nsinks);
  pthread_mutex_lock(&ps->lock);
  pubsub__match(ps, m, want);
  pthread_mutex_unlock(&ps->lock);
  bool w = want[sink];
  if (want != stack) free(want);
  return w;
}
