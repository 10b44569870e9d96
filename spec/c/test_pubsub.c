/* SPDX-License-Identifier: MIT */

/* Unit tests for src/cluster/pubsub.h: the post office. Subscriber counts
 * per sink, first/last answers, exact channels and glob patterns, delivery
 * once per interested sink with exceptions, clearing a sink, a table that
 * grows, and 4 threads at once (run it under TSan). Own main(); checks from
 * check.h (from the main thread only: the threads report through atomics). */
#include "cluster/pubsub.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* ---- a recording deliver callback ---- */

#define MAX_SINKS 128

typedef struct {
  int calls[MAX_SINKS]; /* deliveries per sink */
  int total;
  int order[256]; /* sinks in call order (first 256) */
  pubsub_msg_t *last;
  int bad_ptr; /* deliveries whose message was not the published one */
  pubsub_msg_t *expect;
} rec_t;

static void rec_deliver(int sink, pubsub_msg_t *m, void *arg) {
  rec_t *r = arg;
  if (sink >= 0 && sink < MAX_SINKS) r->calls[sink]++;
  if (r->total < 256) r->order[r->total] = sink;
  r->total++;
  if (r->expect && m != r->expect) r->bad_ptr++;
  r->last = m;
}

static void rec_reset(rec_t *r) { memset(r, 0, sizeof(*r)); }

static int sub(pubsub_t *ps, int sink, const char *ch) {
  return pubsub_subscribe(ps, sink, ch, strlen(ch), false);
}
static int unsub(pubsub_t *ps, int sink, const char *ch) {
  return pubsub_unsubscribe(ps, sink, ch, strlen(ch), false);
}
static int psub(pubsub_t *ps, int sink, const char *pat) {
  return pubsub_subscribe(ps, sink, pat, strlen(pat), true);
}
static int punsub(pubsub_t *ps, int sink, const char *pat) {
  return pubsub_unsubscribe(ps, sink, pat, strlen(pat), true);
}

/* Publishes "payload" on `ch`; returns pubsub_publish's count. The record
 * is reset first. */
static int pub_ex(pubsub_t *ps, rec_t *r, const char *ch, int ex1, int ex2) {
  pubsub_msg_t *m = pubsub_msg_new(ch, strlen(ch), "payload", 7, 0);
  if (!m) return -1000;
  rec_reset(r);
  r->expect = m;
  int n = pubsub_publish(ps, m, ex1, ex2);
  pubsub_msg_unref(m);
  return n;
}
static int pub(pubsub_t *ps, rec_t *r, const char *ch) {
  return pub_ex(ps, r, ch, -1, -1);
}

static bool wants(pubsub_t *ps, int sink, const char *ch) {
  pubsub_msg_t *m = pubsub_msg_new(ch, strlen(ch), "", 0, 0);
  bool w = m && pubsub_wants(ps, sink, m);
  if (m) pubsub_msg_unref(m);
  return w;
}

/* ---- messages ---- */

static void test_msg(void) {
  pubsub_msg_t *m = pubsub_msg_new("chan", 4, "hello", 5, PUBSUB_JSON);
  CHECK(m != NULL);
  if (!m) return;
  CHECK_EQ(m->clen, 4);
  CHECK_EQ(m->mlen, 5);
  CHECK_EQ(m->flags, PUBSUB_JSON);
  CHECK(memcmp(pubsub_msg_channel(m), "chan", 4) == 0);
  CHECK(memcmp(pubsub_msg_body(m), "hello", 5) == 0);
  pubsub_msg_ref(m);
  pubsub_msg_unref(m);
  CHECK(memcmp(pubsub_msg_body(m), "hello", 5) == 0); /* still alive */
  pubsub_msg_unref(m);

  /* empty channel and message; binary bytes */
  m = pubsub_msg_new("", 0, NULL, 0, 0);
  CHECK(m != NULL);
  if (m) {
    CHECK_EQ(m->clen, 0);
    CHECK_EQ(m->mlen, 0);
    pubsub_msg_unref(m);
  }
  m = pubsub_msg_new("a\0b", 3, "\0\xff\0", 3, 0);
  CHECK(m != NULL);
  if (m) {
    CHECK(memcmp(pubsub_msg_channel(m), "a\0b", 3) == 0);
    CHECK(memcmp(pubsub_msg_body(m), "\0\xff\0", 3) == 0);
    pubsub_msg_unref(m);
  }
}

/* ---- first / last, counts per sink ---- */

static void test_first_last(void) {
  rec_t r;
  pubsub_t *ps = pubsub_new(3, rec_deliver, &r);
  CHECK(ps != NULL);
  if (!ps) return;

  CHECK_EQ(sub(ps, 0, "news"), 1);  /* first in the whole office */
  CHECK_EQ(sub(ps, 0, "news"), 0);  /* same sink again */
  CHECK_EQ(sub(ps, 1, "news"), 0);  /* another sink: not first */
  CHECK_EQ(sub(ps, 2, "other"), 1); /* another channel */

  CHECK_EQ(unsub(ps, 0, "news"), 0); /* sink 0 still has one, sink 1 too */
  CHECK_EQ(pub(ps, &r, "news"), 2);
  CHECK_EQ(r.calls[0], 1);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(r.calls[2], 0);
  CHECK_EQ(unsub(ps, 0, "news"), 0); /* sink 0 has none now; sink 1 has */
  CHECK_EQ(pub(ps, &r, "news"), 1);
  CHECK_EQ(r.calls[0], 0);
  CHECK_EQ(r.calls[1], 1);
  /* sink 0 has none left: unsubscribing again changes nothing */
  CHECK_EQ(unsub(ps, 0, "news"), 0);
  CHECK_EQ(unsub(ps, 2, "news"), 0); /* never had one */
  CHECK_EQ(pub(ps, &r, "news"), 1);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(unsub(ps, 1, "news"), 1); /* the last in the whole office */
  CHECK_EQ(pub(ps, &r, "news"), 0);
  CHECK_EQ(r.total, 0);
  CHECK_EQ(unsub(ps, 1, "news"), 0); /* none left */
  CHECK_EQ(unsub(ps, 0, "never"), 0);

  /* and first again after the last */
  CHECK_EQ(sub(ps, 2, "news"), 1);
  CHECK_EQ(pub(ps, &r, "news"), 1);
  CHECK_EQ(r.calls[2], 1);
  CHECK_EQ(unsub(ps, 2, "news"), 1);

  /* counts per sink: three of sink 1, one of sink 0 */
  CHECK_EQ(sub(ps, 1, "c"), 1);
  CHECK_EQ(sub(ps, 1, "c"), 0);
  CHECK_EQ(sub(ps, 1, "c"), 0);
  CHECK_EQ(sub(ps, 0, "c"), 0);
  CHECK_EQ(unsub(ps, 1, "c"), 0);
  CHECK_EQ(unsub(ps, 1, "c"), 0);
  CHECK(wants(ps, 1, "c"));
  CHECK_EQ(unsub(ps, 1, "c"), 0);
  CHECK(!wants(ps, 1, "c"));
  CHECK(wants(ps, 0, "c"));
  CHECK_EQ(unsub(ps, 1, "c"), 0); /* sink 1 has none: sink 0's stays */
  CHECK(wants(ps, 0, "c"));
  CHECK_EQ(unsub(ps, 0, "c"), 1);
  CHECK(!wants(ps, 0, "c"));

  CHECK_EQ(unsub(ps, 2, "other"), 1);

  /* binary channel names: NUL bytes count */
  CHECK_EQ(pubsub_subscribe(ps, 0, "a\0b", 3, false), 1);
  CHECK_EQ(pubsub_subscribe(ps, 0, "a\0c", 3, false), 1);
  CHECK_EQ(pubsub_subscribe(ps, 0, "a", 1, false), 1);
  CHECK_EQ(pubsub_unsubscribe(ps, 0, "a\0b", 3, false), 1);
  CHECK_EQ(pubsub_unsubscribe(ps, 0, "a\0c", 3, false), 1);
  CHECK_EQ(pubsub_unsubscribe(ps, 0, "a", 1, false), 1);

  /* the empty channel is a channel */
  CHECK_EQ(pubsub_subscribe(ps, 1, "", 0, false), 1);
  CHECK_EQ(pub(ps, &r, ""), 1);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(pubsub_unsubscribe(ps, 1, "", 0, false), 1);
  pubsub_free(ps);
}

/* ---- exact channels and patterns ---- */

static void test_exact_vs_pattern(void) {
  rec_t r;
  pubsub_t *ps = pubsub_new(4, rec_deliver, &r);
  CHECK(ps != NULL);
  if (!ps) return;

  /* "chat.*" as an exact channel only matches itself */
  CHECK_EQ(sub(ps, 0, "chat.*"), 1);
  CHECK_EQ(pub(ps, &r, "chat.lobby"), 0);
  CHECK_EQ(pub(ps, &r, "chat.*"), 1);
  CHECK_EQ(r.calls[0], 1);

  /* the same text as a pattern is another entry: first again */
  CHECK_EQ(psub(ps, 1, "chat.*"), 1);
  CHECK_EQ(psub(ps, 2, "chat.*"), 0);
  CHECK_EQ(pub(ps, &r, "chat.lobby"), 2);
  CHECK_EQ(r.calls[0], 0);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(r.calls[2], 1);
  CHECK_EQ(pub(ps, &r, "chat.*"), 3);
  CHECK_EQ(pub(ps, &r, "chat"), 0);

  /* removing the exact one leaves the pattern, and the other way */
  CHECK_EQ(unsub(ps, 0, "chat.*"), 1);
  CHECK_EQ(pub(ps, &r, "chat.*"), 2);
  CHECK_EQ(r.calls[0], 0);
  /* an exact unsubscribe does not touch a pattern's count */
  CHECK_EQ(unsub(ps, 1, "chat.*"), 0);
  CHECK_EQ(pub(ps, &r, "chat.x"), 2);
  CHECK_EQ(punsub(ps, 1, "chat.*"), 0);
  CHECK_EQ(punsub(ps, 2, "chat.*"), 1);
  CHECK_EQ(pub(ps, &r, "chat.x"), 0);

  /* Redis glob semantics reach the post office */
  CHECK_EQ(psub(ps, 0, "user.?"), 1);
  CHECK_EQ(psub(ps, 1, "[abc]*"), 1);
  CHECK_EQ(psub(ps, 2, "x\\*y"), 1);
  CHECK_EQ(pub(ps, &r, "user.1"), 1);
  CHECK_EQ(r.calls[0], 1);
  CHECK_EQ(pub(ps, &r, "user.12"), 0);
  CHECK_EQ(pub(ps, &r, "banana"), 1);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(pub(ps, &r, "dog"), 0);
  CHECK_EQ(pub(ps, &r, "x*y"), 1);
  CHECK_EQ(r.calls[2], 1);
  CHECK_EQ(pub(ps, &r, "xzy"), 0);
  CHECK(wants(ps, 0, "user.7"));
  CHECK(!wants(ps, 0, "user.77"));
  CHECK(!wants(ps, 1, "user.7"));
  CHECK_EQ(punsub(ps, 0, "user.?"), 1);
  CHECK_EQ(punsub(ps, 1, "[abc]*"), 1);
  CHECK_EQ(punsub(ps, 2, "x\\*y"), 1);
  CHECK_EQ(punsub(ps, 2, "x\\*y"), 0);
  pubsub_free(ps);
}

/* ---- delivery: once per sink, exceptions ---- */

static void test_publish(void) {
  rec_t r;
  pubsub_t *ps = pubsub_new(4, rec_deliver, &r);
  CHECK(ps != NULL);
  if (!ps) return;

  /* sink 1 matches through its exact channel, two patterns and twice the
   * same exact channel: it still gets the message once */
  CHECK_EQ(sub(ps, 1, "room.1"), 1);
  CHECK_EQ(sub(ps, 1, "room.1"), 0);
  CHECK_EQ(psub(ps, 1, "room.*"), 1);
  CHECK_EQ(psub(ps, 1, "*"), 1);
  CHECK_EQ(psub(ps, 3, "room.?"), 1);
  CHECK_EQ(sub(ps, 0, "room.1"), 0);

  CHECK_EQ(pub(ps, &r, "room.1"), 3);
  CHECK_EQ(r.total, 3);
  CHECK_EQ(r.calls[0], 1);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(r.calls[2], 0);
  CHECK_EQ(r.calls[3], 1);
  CHECK_EQ(r.bad_ptr, 0); /* every sink got the published block */

  /* exceptions */
  CHECK_EQ(pub_ex(ps, &r, "room.1", 1, -1), 2);
  CHECK_EQ(r.calls[1], 0);
  CHECK_EQ(r.calls[0] + r.calls[3], 2);
  CHECK_EQ(pub_ex(ps, &r, "room.1", -1, 3), 2);
  CHECK_EQ(r.calls[3], 0);
  CHECK_EQ(pub_ex(ps, &r, "room.1", 0, 3), 1);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(r.total, 1);
  CHECK_EQ(pub_ex(ps, &r, "room.1", 3, 0), 1);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(pub_ex(ps, &r, "room.1", 2, 2), 3); /* excepting a sink without interest */
  CHECK_EQ(pub_ex(ps, &r, "room.1", 1, 1), 2);
  CHECK_EQ(r.calls[1], 0);

  /* only the pattern "*" matches this one */
  CHECK_EQ(pub(ps, &r, "lobby"), 1);
  CHECK_EQ(r.calls[1], 1);
  CHECK_EQ(pub_ex(ps, &r, "lobby", 1, -1), 0);
  CHECK_EQ(r.total, 0);

  /* pubsub_wants */
  pubsub_msg_t *m = pubsub_msg_new("room.1", 6, "x", 1, 0);
  CHECK(pubsub_wants(ps, 0, m));
  CHECK(pubsub_wants(ps, 1, m));
  CHECK(!pubsub_wants(ps, 2, m));
  CHECK(pubsub_wants(ps, 3, m));
  CHECK(!pubsub_wants(ps, 4, m));  /* no such sink */
  CHECK(!pubsub_wants(ps, -1, m)); /* no such sink */
  pubsub_msg_unref(m);
  CHECK(wants(ps, 3, "room.9"));
  CHECK(!wants(ps, 3, "room.10"));
  CHECK(!wants(ps, 0, "room.9"));

  pubsub_free(ps);
}

/* A deliver callback that keeps the message, as a lane's mailbox does. */
typedef struct {
  pubsub_msg_t *kept[8];
  int n;
} keep_t;

static void keep_deliver(int sink, pubsub_msg_t *m, void *arg) {
  keep_t *k = arg;
  pubsub_msg_ref(m);
  if (k->n < 8) k->kept[k->n++] = m;
  else pubsub_msg_unref(m);
}

static void test_refs(void) {
  keep_t k = {{0}, 0};
  pubsub_t *ps = pubsub_new(3, keep_deliver, &k);
  CHECK(ps != NULL);
  if (!ps) return;
  for (int s = 0; s < 3; s++) CHECK_EQ(sub(ps, s, "c"), s == 0);
  pubsub_msg_t *m = pubsub_msg_new("c", 1, "body", 4, 0);
  CHECK_EQ(pubsub_publish(ps, m, -1, -1), 3);
  pubsub_msg_unref(m); /* the publisher's reference */
  CHECK_EQ(k.n, 3);
  for (int i = 0; i < k.n; i++) {
    CHECK(k.kept[i] == m);
    CHECK(memcmp(pubsub_msg_body(k.kept[i]), "body", 4) == 0);
    pubsub_msg_unref(k.kept[i]); /* the last one frees it (ASan checks) */
  }
  pubsub_free(ps);
}

/* ---- clearing a sink ---- */

static void test_clear_sink(void) {
  rec_t r;
  pubsub_t *ps = pubsub_new(3, rec_deliver, &r);
  CHECK(ps != NULL);
  if (!ps) return;
  CHECK_EQ(sub(ps, 1, "only1"), 1);
  CHECK_EQ(sub(ps, 1, "only1"), 0);
  CHECK_EQ(sub(ps, 1, "shared"), 1);
  CHECK_EQ(sub(ps, 2, "shared"), 0);
  CHECK_EQ(psub(ps, 1, "p.*"), 1);
  CHECK_EQ(psub(ps, 0, "q.*"), 1);
  CHECK_EQ(psub(ps, 1, "q.*"), 0);

  pubsub_clear_sink(ps, 1, NULL, NULL);
  CHECK_EQ(pub(ps, &r, "only1"), 0);
  CHECK_EQ(pub(ps, &r, "shared"), 1);
  CHECK_EQ(r.calls[2], 1);
  CHECK_EQ(pub(ps, &r, "p.x"), 0);
  CHECK_EQ(pub(ps, &r, "q.x"), 1);
  CHECK_EQ(r.calls[0], 1);
  CHECK(!wants(ps, 1, "shared"));
  CHECK(!wants(ps, 1, "q.x"));

  /* what only sink 1 had is gone: a new subscriber is the first */
  CHECK_EQ(sub(ps, 0, "only1"), 1);
  CHECK_EQ(psub(ps, 2, "p.*"), 1);
  /* what others still have is not: the next is not first */
  CHECK_EQ(sub(ps, 1, "shared"), 0);
  CHECK_EQ(psub(ps, 1, "q.*"), 0);
  /* sink 1 starts from zero: one unsubscribe takes its one subscriber */
  CHECK_EQ(unsub(ps, 1, "shared"), 0);
  CHECK_EQ(unsub(ps, 1, "shared"), 0);
  CHECK_EQ(unsub(ps, 2, "shared"), 1);
  CHECK_EQ(punsub(ps, 1, "q.*"), 0);
  CHECK_EQ(punsub(ps, 0, "q.*"), 1);
  /* unsubscribing what was cleared does nothing */
  CHECK_EQ(unsub(ps, 1, "only1"), 0);
  CHECK_EQ(pub(ps, &r, "only1"), 1);
  CHECK_EQ(r.calls[0], 1);
  CHECK_EQ(unsub(ps, 0, "only1"), 1);
  CHECK_EQ(punsub(ps, 2, "p.*"), 1);

  /* clearing a sink with nothing, or a sink that does not exist */
  pubsub_clear_sink(ps, 0, NULL, NULL);
  pubsub_clear_sink(ps, 3, NULL, NULL);
  pubsub_clear_sink(ps, -1, NULL, NULL);
  CHECK_EQ(sub(ps, 0, "after"), 1);
  CHECK_EQ(unsub(ps, 0, "after"), 1);
  pubsub_free(ps);
}

/* ---- many channels: the table grows ---- */

static void test_many_channels(void) {
  rec_t r;
  pubsub_t *ps = pubsub_new(2, rec_deliver, &r);
  CHECK(ps != NULL);
  if (!ps) return;
  enum { N = 20000 };
  char ch[32];
  int firsts = 0, seconds = 0;
  for (int i = 0; i < N; i++) {
    int len = snprintf(ch, sizeof(ch), "channel.%d", i);
    firsts += pubsub_subscribe(ps, i % 2, ch, (size_t)len, false) == 1;
    seconds += pubsub_subscribe(ps, (i + 1) % 2, ch, (size_t)len, false) == 0;
  }
  CHECK_EQ(firsts, N);
  CHECK_EQ(seconds, N);
  int delivered = 0, wrong = 0;
  for (int i = 0; i < N; i += 7) {
    snprintf(ch, sizeof(ch), "channel.%d", i);
    delivered += pub(ps, &r, ch) == 2;
    wrong += r.calls[0] != 1 || r.calls[1] != 1;
  }
  CHECK_EQ(delivered, (N + 6) / 7);
  CHECK_EQ(wrong, 0);
  CHECK_EQ(pub(ps, &r, "channel.20000"), 0);
  CHECK_EQ(pub(ps, &r, "channel."), 0);
  /* unsubscribe in another order: each is last once its second goes */
  int lasts = 0, notlast = 0;
  for (int i = N - 1; i >= 0; i--) {
    int len = snprintf(ch, sizeof(ch), "channel.%d", i);
    notlast += pubsub_unsubscribe(ps, 0, ch, (size_t)len, false) == 0;
    lasts += pubsub_unsubscribe(ps, 1, ch, (size_t)len, false) == 1;
  }
  CHECK_EQ(notlast, N);
  CHECK_EQ(lasts, N);
  CHECK_EQ(pub(ps, &r, "channel.5"), 0);
  /* grows again after emptying */
  int again = 0;
  for (int i = 0; i < 500; i++) {
    int len = snprintf(ch, sizeof(ch), "c%d", i);
    again += pubsub_subscribe(ps, 1, ch, (size_t)len, false) == 1;
  }
  CHECK_EQ(again, 500);
  CHECK_EQ(pub(ps, &r, "c499"), 1);
  pubsub_free(ps); /* with entries left: freed (ASan checks) */
}

/* ---- more sinks than fit on the stack ---- */

static void test_many_sinks(void) {
  rec_t r;
  pubsub_t *ps = pubsub_new(MAX_SINKS, rec_deliver, &r);
  CHECK(ps != NULL);
  if (!ps) return;
  int firsts = 0;
  for (int s = 0; s < MAX_SINKS; s += 3) firsts += sub(ps, s, "wide");
  CHECK_EQ(firsts, 1);
  CHECK_EQ(psub(ps, MAX_SINKS - 1, "w*"), 1);
  int want = (MAX_SINKS + 2) / 3 + ((MAX_SINKS - 1) % 3 != 0);
  CHECK_EQ(pub(ps, &r, "wide"), want);
  CHECK_EQ(r.calls[MAX_SINKS - 1], 1);
  CHECK_EQ(r.calls[3], 1);
  CHECK_EQ(r.calls[4], 0);
  CHECK_EQ(pub_ex(ps, &r, "wide", 0, MAX_SINKS - 1), want - 2);
  CHECK(wants(ps, MAX_SINKS - 1, "wx"));
  CHECK(!wants(ps, MAX_SINKS - 3, "wide")); /* 125: not a multiple of 3 */
  pubsub_clear_sink(ps, MAX_SINKS - 1, NULL, NULL);
  CHECK(!wants(ps, MAX_SINKS - 1, "wx"));
  pubsub_free(ps);
}

/* ---- 4 threads at once ---- */

enum { THREADS = 4, ROUNDS = 3000, SHARED = 16 };

typedef struct {
  _Atomic int calls[THREADS];
  _Atomic int total;
} arec_t;

static void arec_deliver(int sink, pubsub_msg_t *m, void *arg) {
  arec_t *a = arg;
  /* read the message as a lane would */
  volatile char c = m->clen ? pubsub_msg_channel(m)[0] : 0;
  (void)c;
  if (sink >= 0 && sink < THREADS)
    atomic_fetch_add_explicit(&a->calls[sink], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&a->total, 1, memory_order_relaxed);
}

typedef struct {
  pubsub_t *ps;
  int sink;
  int own_delivered; /* publishes to its own channel that reached >= 1 sink */
  int firsts, lasts; /* on the shared channels and patterns */
  int bad;           /* impossible answers */
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  char own[32], ch[32];
  int olen = snprintf(own, sizeof(own), "own.%d", w->sink);
  if (pubsub_subscribe(w->ps, w->sink, own, (size_t)olen, false) != 1) w->bad++;
  unsigned seed = 7u + (unsigned)w->sink;
  int held[SHARED] = {0}, pheld = 0;
  for (int i = 0; i < ROUNDS; i++) {
    seed = seed * 1103515245u + 12345u;
    int k = (int)((seed >> 8) % SHARED);
    int len = snprintf(ch, sizeof(ch), "shared.%d", k);
    switch ((seed >> 4) % 4) {
    case 0:
    case 1: {
      int rc = pubsub_subscribe(w->ps, w->sink, ch, (size_t)len, false);
      if (rc < 0) w->bad++;
      w->firsts += rc == 1;
      held[k]++;
      break;
    }
    case 2:
      if (held[k] > 0) {
        int rc = pubsub_unsubscribe(w->ps, w->sink, ch, (size_t)len, false);
        w->lasts += rc == 1;
        held[k]--;
      }
      break;
    default: {
      pubsub_msg_t *m = pubsub_msg_new(ch, (size_t)len, "m", 1, 0);
      if (m) {
        pubsub_publish(w->ps, m, -1, -1);
        if (held[k] > 0 && !pubsub_wants(w->ps, w->sink, m)) w->bad++;
        pubsub_msg_unref(m);
      }
      break;
    }
    }
    /* a pattern that comes and goes */
    if (i % 50 == 0) {
      int rc = pheld ? pubsub_unsubscribe(w->ps, w->sink, "shared.*", 8, true)
                     : pubsub_subscribe(w->ps, w->sink, "shared.*", 8, true);
      if (pheld) w->lasts += rc == 1; else w->firsts += rc == 1;
      pheld = !pheld;
    }
    /* its own channel always reaches it */
    if (i % 10 == 0) {
      pubsub_msg_t *m = pubsub_msg_new(own, (size_t)olen, "x", 1, 0);
      if (m) {
        w->own_delivered += pubsub_publish(w->ps, m, -1, -1) >= 1;
        pubsub_msg_unref(m);
      }
    }
  }
  /* give everything back */
  for (int k = 0; k < SHARED; k++) {
    int len = snprintf(ch, sizeof(ch), "shared.%d", k);
    while (held[k] > 0) {
      w->lasts += pubsub_unsubscribe(w->ps, w->sink, ch, (size_t)len, false) == 1;
      held[k]--;
    }
  }
  if (pheld) w->lasts += pubsub_unsubscribe(w->ps, w->sink, "shared.*", 8, true) == 1;
  if (pubsub_unsubscribe(w->ps, w->sink, own, (size_t)olen, false) != 1) w->bad++;
  return NULL;
}

static void test_threads(void) {
  arec_t a;
  memset(&a, 0, sizeof(a));
  pubsub_t *ps = pubsub_new(THREADS, arec_deliver, &a);
  CHECK(ps != NULL);
  if (!ps) return;
  pthread_t t[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker_t){.ps = ps, .sink = i};
    CHECK_EQ(pthread_create(&t[i], NULL, worker, &w[i]), 0);
  }
  int firsts = 0, lasts = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    CHECK_EQ(w[i].bad, 0);
    CHECK_EQ(w[i].own_delivered, ROUNDS / 10);
    firsts += w[i].firsts;
    lasts += w[i].lasts;
  }
  /* every entry that was created was dropped: as many firsts as lasts */
  CHECK_EQ(firsts, lasts);
  CHECK(firsts > 0);
  CHECK(atomic_load(&a.total) > 0);
  for (int i = 0; i < THREADS; i++) CHECK(atomic_load(&a.calls[i]) >= ROUNDS / 10);
  /* nothing is left */
  char ch[32];
  int left = 0;
  for (int k = 0; k < SHARED; k++) {
    snprintf(ch, sizeof(ch), "shared.%d", k);
    for (int s = 0; s < THREADS; s++) left += wants(ps, s, ch);
  }
  CHECK_EQ(left, 0);
  for (int s = 0; s < THREADS; s++) CHECK_EQ(sub(ps, s, "shared.3"), s == 0);
  pubsub_free(ps);
}

/* What the Redis engine needs: the channels and patterns that lose their
 * last subscriber when a sink goes, every key, and the match count. */
typedef struct {
  char keys[8][32];
  bool pattern[8];
  int n;
} keys_t;

static void keep_key(const char *k, size_t len, bool pattern, void *arg) {
  keys_t *ks = arg;
  if (ks->n >= 8 || len >= 32) return;
  memcpy(ks->keys[ks->n], k, len);
  ks->keys[ks->n][len] = 0;
  ks->pattern[ks->n++] = pattern;
}

static bool has_key(const keys_t *ks, const char *k, bool pattern) {
  for (int i = 0; i < ks->n; i++)
    if (strcmp(ks->keys[i], k) == 0 && ks->pattern[i] == pattern) return true;
  return false;
}

static void test_engine_support(void) {
  rec_t r;
  pubsub_t *ps = pubsub_new(3, rec_deliver, &r);
  CHECK(ps != NULL);
  if (!ps) return;
  sub(ps, 1, "a.x");
  sub(ps, 1, "shared");
  sub(ps, 2, "shared");
  psub(ps, 1, "a.*");
  psub(ps, 2, "*");
  /* a copy for one subscription reaches only that subscription's sinks */
  pubsub_msg_t *m = pubsub_msg_new("a.x", 3, "m", 1, PUBSUB_EXACT);
  memset(&r, 0, sizeof(r));
  CHECK_EQ(pubsub_publish(ps, m, -1, -1), 1); /* sink 1 (a.x), not 2 (*) */
  CHECK_EQ(r.calls[1], 1);
  pubsub_msg_unref(m);
  m = pubsub_msg_new_for("a.x", 3, "m", 1, "*", 1, PUBSUB_PATTERN);
  memset(&r, 0, sizeof(r));
  CHECK_EQ(pubsub_publish(ps, m, -1, -1), 1); /* sink 2 only */
  CHECK_EQ(r.calls[2], 1);
  CHECK(m->plen == 1 && pubsub_msg_pattern(m)[0] == '*');
  pubsub_msg_unref(m);
  m = pubsub_msg_new_for("a.x", 3, "m", 1, "a.*", 3, PUBSUB_PATTERN);
  memset(&r, 0, sizeof(r));
  CHECK_EQ(pubsub_publish(ps, m, -1, -1), 1); /* sink 1 only */
  CHECK_EQ(r.calls[1], 1);
  pubsub_msg_unref(m);
  keys_t all = {0};
  pubsub_each(ps, keep_key, &all);
  CHECK_EQ(all.n, 4);
  CHECK(has_key(&all, "a.x", false) && has_key(&all, "shared", false));
  CHECK(has_key(&all, "a.*", true) && has_key(&all, "*", true));
  keys_t gone = {0};
  pubsub_clear_sink(ps, 1, keep_key, &gone);
  CHECK_EQ(gone.n, 2);
  CHECK(has_key(&gone, "a.x", false) && has_key(&gone, "a.*", true));
  pubsub_free(ps);
}

int main(void) {
  test_msg();
  test_engine_support();
  test_first_last();
  test_exact_vs_pattern();
  test_publish();
  test_refs();
  test_clear_sink();
  test_many_channels();
  test_many_sinks();
  test_threads();
  return check_summary();
}
