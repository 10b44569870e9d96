/* SPDX-License-Identifier: MIT */

/* h2_mem: the pages an idle HTTP/2 session gives back (nghttp2_mem).
 *
 * nghttp2 makes two big blocks with each session and keeps them for the
 * session's life: the frame buffer it packs outgoing frames into (16 KiB
 * and 10 bytes) and the table of its stream map (4 KiB: 256 buckets, all
 * zero once no stream is open). An idle session needs the contents of
 * neither: the frame buffer is written from its start each time a frame is
 * packed and read only by the send that follows, and an empty map is
 * zeros. Left in malloc's heap they cost an idle session the pages they
 * touched, about half of its memory. So the session's allocator puts the
 * big blocks nghttp2 asks for while the session is made into a slot of
 * whole pages from the lane's pool, and the lane's sweep (once a second,
 * only while some session holds pages) gives the pages of a session that
 * was quiet for a whole second and has nothing to send back to the kernel
 * (MADV_DONTNEED: the next touch maps a zero page). A block is given back
 * when it is the frame buffer, when it reads as zeros (whatever nghttp2
 * keeps in it: zeros are what the kernel gives back), or when nghttp2
 * freed it. A busy session makes no system call for this; one that goes
 * quiet makes one madvise, and pays two page faults when it speaks again.
 *
 * The two HPACK rings nghttp2 makes with a session (1 KiB of entry
 * pointers each, of which an idle session uses a few words) share the
 * slot's first page. Their words can't be given back as they are, so the
 * sweep copies the ones that are not zero aside (h2__rings_save), gives
 * the page back with the rest, and h2_mem_wake writes them back before
 * nghttp2's next call that may read the tables: about 2 KiB of an idle
 * session's 7 became some 100 bytes. A busy session's page stays.
 *
 * The pool also keeps a few spare blocks of the sizes every request takes
 * and gives back (its stream struct, request struct, header bytes' and
 * response's first buffers: h2_spare_take), which are too big for glibc's
 * per-thread cache, and the small blocks nghttp2 frees (its stream, the
 * frames it queues, its copy of a head's fields: a dozen mallocs and
 * frees a request, each 100 to 200 instructions in glibc, 10 to 30 from a
 * list); they go with the warm sessions' pages, once none is left.
 *
 * Slots come from regions of H2_REGION_SLOTS, mapped on demand and kept
 * for the lane's life (address space, not memory: a free slot holds no
 * page, but for the few last freed, which the next sessions take warm).
 *
 * Threads: a pool and its sessions belong to one lane's reactor thread. */
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "http/h2_int.h"

/* Slots a region holds (one mmap). */
#define H2_REGION_SLOTS 64
/* Freed slots that keep their pages for the next session (the sweep gives
 * them back if none comes). */
#define H2_WARM_FREE 8
/* A quiet session's pages go back at the sweep after a whole sweep
 * interval without activity. */
#define H2_SWEEP_MS 1000
/* Blocks nghttp2 asks for at least this big while a session is made go to
 * its slot. */
#define H2_MEM_BIG 4096
/* An HPACK ring: nghttp2's hd_ringbuf of a table's entry pointers, made
 * with the session for a 4 KiB table (128 entries) whatever the table's
 * size is to be, and the only blocks of this size a session is made with
 * (nghttp2 1.52; the two of a session go to its slot's first page). */
#define H2_RING_BYTES (128 * sizeof(void *))
#define H2_RINGS 2
/* Spare blocks of each kind a lane keeps (h2_spare_take): as many as the
 * requests one read of a busy connection makes whole, about. */
#define H2_SPARE_KEEP 16
/* Small blocks nghttp2 frees that a lane keeps for its sessions' next
 * asks: in classes of glibc's chunk sizes (usable 24, 40, ... bytes), up
 * to H2_SMALL_KEEP a class. */
#define H2_SMALL_CLASSES 64
#define H2_SMALL_MIN 24
#define H2_SMALL_MAX (H2_SMALL_MIN + 16 * (H2_SMALL_CLASSES - 1))
#define H2_SMALL_KEEP 32
/* Neither spare nor small blocks are kept under ASan, so that a use after
 * free is still caught. */
#if defined(__SANITIZE_ADDRESS__)
#define H2_KEEP_BLOCKS false
#else
#define H2_KEEP_BLOCKS true
#endif

struct h2_pool {
  reactor_t *r;
  size_t page, slot; /* bytes */
  char **regions;
  size_t nregions;
  char **free; /* free slots: the top nwarm keep their pages */
  size_t nfree, nwarm, cap;
  h2_mem_t *warm;  /* sessions whose slot pages may be resident */
  size_t sessions; /* with a slot */
  mp_timer_t sweep;
  void *spare[H2_SPARES][H2_SPARE_KEEP];
  int nspare[H2_SPARES];
  void *small[H2_SMALL_CLASSES]; /* lists through each block's first word */
  int nsmall[H2_SMALL_CLASSES];
};

static size_t h2__round(size_t n, size_t to) { return (n + to - 1) / to * to; }

h2_pool_t *h2_pool_new(reactor_t *r) {
  h2_pool_t *p = calloc(1, sizeof(*p));
  if (!p) return NULL;
  long ps = sysconf(_SC_PAGESIZE);
  p->r = r;
  p->page = ps > 0 ? (size_t)ps : 4096;
  /* the HPACK rings' page, the map's table and the frame buffer, each
   * from a page boundary */
  p->slot = p->page + h2__round(H2_MEM_BIG, p->page) +
            h2__round((16u << 10) + 64, p->page);
  timer_init(&p->sweep);
  return p;
}

/* ---- spare blocks ---- */

static size_t h2__spare_size(int kind) {
  switch (kind) {
  case H2_SPARE_STREAM: return sizeof(h2_stream_t);
  case H2_SPARE_REQ: return sizeof(struct h2_req);
  case H2_SPARE_HBUF: return H2_HBUF_FIRST;
  default: return H2_OBUF_FIRST;
  }
}

void *h2_spare_take(h2_pool_t *p, int kind) {
  if (p && p->nspare[kind]) return p->spare[kind][--p->nspare[kind]];
  return malloc(h2__spare_size(kind));
}

void h2_spare_put(h2_pool_t *p, int kind, void *b) {
  if (H2_KEEP_BLOCKS && p && b && p->nspare[kind] < H2_SPARE_KEEP)
    p->spare[kind][p->nspare[kind]++] = b;
  else
    free(b);
}

void *h2_spare_realloc(h2_pool_t *p, int kind, void *b, size_t cap) {
  if (!b && cap == h2__spare_size(kind)) return h2_spare_take(p, kind);
  return realloc(b, cap);
}

void h2_spare_free(h2_pool_t *p, int kind, void *b, size_t cap) {
  if (cap == h2__spare_size(kind))
    h2_spare_put(p, kind, b);
  else
    free(b);
}

/* The spare and small blocks go (the lane's sessions are quiet, or it
 * ends). */
static void h2__spares_free(h2_pool_t *p) {
  for (int k = 0; k < H2_SPARES; k++)
    while (p->nspare[k]) free(p->spare[k][--p->nspare[k]]);
  for (int k = 0; k < H2_SMALL_CLASSES; k++) {
    while (p->small[k]) {
      void *b = p->small[k];
      memcpy(&p->small[k], b, sizeof(void *));
      free(b);
    }
    p->nsmall[k] = 0;
  }
}

/* A kept small block of at least n bytes, or NULL (none kept, or n past
 * the classes). */
static void *h2__small_take(h2_pool_t *p, size_t n) {
  if (!p || n > H2_SMALL_MAX) return NULL;
  size_t k = n <= H2_SMALL_MIN ? 0 : (n - H2_SMALL_MIN + 15) / 16;
  void *b = p->small[k];
  if (!b) return NULL;
  memcpy(&p->small[k], b, sizeof(void *));
  p->nsmall[k]--;
  return b;
}

/* Keeps b (a malloc block) in the class its usable size fills; false when
 * it is too small, too big or its class is full. */
static bool h2__small_put(h2_pool_t *p, void *b) {
  if (!H2_KEEP_BLOCKS) return false;
  size_t u = malloc_usable_size(b);
  if (u < H2_SMALL_MIN || u > H2_SMALL_MAX + 15) return false;
  size_t k = (u - H2_SMALL_MIN) / 16;
  if (p->nsmall[k] == H2_SMALL_KEEP) return false;
  memcpy(b, &p->small[k], sizeof(void *));
  p->small[k] = b;
  p->nsmall[k]++;
  return true;
}

void http_h2_pool_free(h2_pool_t *p) {
  if (!p) return;
  h2__spares_free(p);
  /* (no session is left: the sweep was stopped with the last one) */
  for (size_t i = 0; i < p->nregions; i++)
    munmap(p->regions[i], p->slot * H2_REGION_SLOTS);
  free(p->regions);
  free(p->free);
  free(p);
}

/* The whole slot's pages go back. */
static void h2__release(h2_pool_t *p, char *slot) {
  (void)madvise(slot, p->slot, MADV_DONTNEED);
}

/* The free slots that kept their pages give them back. */
static void h2__release_free(h2_pool_t *p) {
  for (size_t i = p->nfree - p->nwarm; i < p->nfree; i++)
    h2__release(p, p->free[i]);
  p->nwarm = 0;
}

/* A free slot, warm if one is; NULL when none can be mapped. */
static char *h2__slot_take(h2_pool_t *p) {
  if (!p->nfree) {
    size_t need = (p->nregions + 1) * H2_REGION_SLOTS; /* all free, at most */
    if (need > p->cap) {
      char **f = realloc(p->free, need * sizeof(*f));
      if (!f) return NULL;
      p->free = f;
      p->cap = need;
    }
    char **rg = realloc(p->regions, (p->nregions + 1) * sizeof(*rg));
    if (!rg) return NULL;
    p->regions = rg;
    char *m = mmap(NULL, p->slot * H2_REGION_SLOTS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return NULL;
    p->regions[p->nregions++] = m;
    for (size_t i = H2_REGION_SLOTS; i-- > 0;)
      p->free[p->nfree++] = m + i * p->slot;
  }
  if (p->nwarm) p->nwarm--;
  return p->free[--p->nfree];
}

/* Gives a slot back to the free list (which has room for every slot
 * mapped); a warm one keeps its pages if fewer than H2_WARM_FREE do. */
static void h2__slot_put(h2_pool_t *p, char *slot, bool warm) {
  if (warm && p->nwarm < H2_WARM_FREE) {
    p->free[p->nfree++] = slot;
    p->nwarm++;
    return;
  }
  if (warm) h2__release(p, slot);
  /* cold: below the warm ones */
  size_t at = p->nfree - p->nwarm;
  if (p->nwarm) p->free[p->nfree] = p->free[at];
  p->free[at] = slot;
  p->nfree++;
}

/* ---- a session's blocks ---- */

static int h2__block_of(const h2_mem_t *m, const void *ptr) {
  for (int i = 0; i < m->nblocks; i++)
    if ((const char *)ptr == m->slot + m->blocks[i].off) return i;
  return -1;
}

static bool h2__in_slot(const h2_mem_t *m, const void *ptr) {
  return m->slot && (const char *)ptr >= m->slot &&
         (const char *)ptr < m->slot + m->pool->slot;
}

/* A block of n bytes in the slot, page-aligned, or NULL. */
static void *h2__block_new(h2_mem_t *m, size_t n, int kind) {
  h2_pool_t *p = m->pool;
  if (!m->making || !m->slot || m->nblocks == H2_MEM_BLOCKS ||
      m->used + n > p->slot)
    return NULL;
  if (n == H2_RING_BYTES && m->nrings < H2_RINGS &&
      H2_RING_BYTES * H2_RINGS <= p->page) {
    h2_block_t *b = &m->blocks[m->nblocks++];
    b->off = (uint32_t)(m->nrings++ * H2_RING_BYTES);
    b->len = (uint32_t)n;
    b->kind = H2_BLOCK_RING;
    /* zeros: the entries copied aside are the words that are not (a warm
     * slot holds a former session's) */
    memset(m->slot + b->off, 0, n);
    return m->slot + b->off;
  }
  if (n < H2_MEM_BIG) return NULL;
  h2_block_t *b = &m->blocks[m->nblocks++];
  b->off = (uint32_t)m->used;
  b->len = (uint32_t)n;
  b->kind = (uint8_t)kind;
  m->used = h2__round(m->used + n, p->page);
  return m->slot + b->off;
}

static void *h2__malloc(size_t n, void *ud) {
  h2_mem_t *m = ud;
  void *q = h2__block_new(m, n, H2_BLOCK_KEEP);
  if (!q) q = h2__small_take(m->pool, n);
  return q ? q : malloc(n);
}

static void *h2__calloc(size_t k, size_t n, void *ud) {
  h2_mem_t *m = ud;
  if (n && k > SIZE_MAX / n) return NULL;
  void *q = h2__block_new(m, k * n, H2_BLOCK_KEEP);
  if (!q) q = h2__small_take(m->pool, k * n);
  if (!q) return calloc(k, n);
  memset(q, 0, k * n); /* (a warm slot, a kept block: former bytes) */
  return q;
}

static void h2__free(void *ptr, void *ud) {
  h2_mem_t *m = ud;
  if (!ptr) return;
  if (!h2__in_slot(m, ptr)) {
    if (!m->pool || !h2__small_put(m->pool, ptr)) free(ptr);
    return;
  }
  int i = h2__block_of(m, ptr);
  if (i >= 0) m->blocks[i].kind = H2_BLOCK_DEAD;
}

static void *h2__realloc(void *ptr, size_t n, void *ud) {
  h2_mem_t *m = ud;
  if (!ptr) {
    /* nghttp2_buf_reserve makes the frame buffer so: the one block of
     * its size a session is made with */
    void *q =
        h2__block_new(m, n, n > (16u << 10) ? H2_BLOCK_FRAMES : H2_BLOCK_KEEP);
    return q ? q : malloc(n);
  }
  if (!h2__in_slot(m, ptr)) return realloc(ptr, n);
  int i = h2__block_of(m, ptr);
  void *q = malloc(n);
  if (!q) return NULL;
  size_t had = i >= 0 ? m->blocks[i].len : 0;
  memcpy(q, ptr, had < n ? had : n);
  if (i >= 0) m->blocks[i].kind = H2_BLOCK_DEAD;
  return q;
}

void h2_mem_init(h2_mem_t *m, h2_pool_t *p) {
  memset(m, 0, sizeof(*m));
  m->mem = (nghttp2_mem){m, h2__malloc, h2__free, h2__calloc, h2__realloc};
  m->pool = p;
  m->slot = p ? h2__slot_take(p) : NULL;
  if (m->slot) {
    p->sessions++;
    m->used = p->page; /* (the first page is the rings') */
  }
}

static void h2__sweep(mp_timer_t *t);

static void h2__unwarm(h2_mem_t *m) {
  if (!m->warm) return;
  *m->wprev = m->wnext;
  if (m->wnext) m->wnext->wprev = m->wprev;
  m->warm = false;
}

void h2_mem_touch(h2_mem_t *m) {
  m->active = true;
  if (m->warm || !m->slot) return;
  h2_pool_t *p = m->pool;
  m->warm = true;
  m->wnext = p->warm;
  if (p->warm) p->warm->wprev = &m->wnext;
  m->wprev = &p->warm;
  p->warm = m;
  if (!p->sweep.armed)
    (void)timer_start(reactor_timers(p->r), &p->sweep, reactor_now(p->r),
                      H2_SWEEP_MS, H2_SWEEP_MS, 0, h2__sweep, NULL, p);
}

/* Whether the block's bytes are all zero. */
static bool h2__zero(const char *b, size_t n) {
  const uint64_t *w = (const uint64_t *)(const void *)b;
  uint64_t any = 0;
  for (size_t i = 0; i < n / 8; i++) any |= w[i];
  for (size_t i = n / 8 * 8; i < n; i++) any |= (unsigned char)b[i];
  return any == 0;
}

/* The HPACK rings' entries, copied aside so that their page can go: for
 * each ring a bitmap of its words that are not zero, then those words.
 * nghttp2 reads only the words it wrote (an entry's, or one evicted since,
 * which it never reads again), so zeros elsewhere change nothing. An idle
 * session's rings hold a few entries (the date and content-type we sent,
 * the client's authority and user agent): some 100 bytes aside instead of
 * 2 KiB. False when out of memory (the page stays). */
typedef uint64_t h2_ring_bits_t[H2_RING_BYTES / sizeof(void *) / 64];

static bool h2__rings_save(h2_mem_t *m) {
  size_t words = H2_RING_BYTES / sizeof(void *), nz = 0;
  if (m->rings) return true; /* (aside since it was last quiet) */
  for (int i = 0; i < m->nblocks; i++) {
    if (m->blocks[i].kind != H2_BLOCK_RING) continue;
    void **w = (void **)(void *)(m->slot + m->blocks[i].off);
    for (size_t j = 0; j < words; j++) nz += w[j] != NULL;
  }
  char *save =
      malloc((size_t)m->nrings * sizeof(h2_ring_bits_t) + nz * sizeof(void *));
  if (!save) return false;
  char *q = save;
  for (int i = 0; i < m->nblocks; i++) {
    if (m->blocks[i].kind != H2_BLOCK_RING) continue;
    void **w = (void **)(void *)(m->slot + m->blocks[i].off);
    uint64_t *bits = (uint64_t *)(void *)q;
    q += sizeof(h2_ring_bits_t);
    memset(bits, 0, sizeof(h2_ring_bits_t));
    for (size_t j = 0; j < words; j++) {
      if (!w[j]) continue;
      bits[j / 64] |= (uint64_t)1 << (j % 64);
      memcpy(q, &w[j], sizeof(void *));
      q += sizeof(void *);
    }
  }
  m->rings = save;
  return true;
}

void h2__mem_wake(h2_mem_t *m) {
  const char *q = m->rings;
  for (int i = 0; i < m->nblocks; i++) {
    if (m->blocks[i].kind != H2_BLOCK_RING) continue;
    void **w = (void **)(void *)(m->slot + m->blocks[i].off);
    uint64_t bits[sizeof(h2_ring_bits_t) / sizeof(uint64_t)];
    memcpy(bits, q, sizeof(bits));
    q += sizeof(bits);
    for (size_t k = 0; k < sizeof(bits) / sizeof(bits[0]); k++)
      for (uint64_t b = bits[k]; b; b &= b - 1) { /* (its set bits) */
        memcpy(&w[k * 64 + (size_t)__builtin_ctzll(b)], q, sizeof(void *));
        q += sizeof(void *);
      }
  }
  free(m->rings);
  m->rings = NULL;
}

/* Gives back the pages of a quiet session's blocks that hold nothing it
 * needs: the frame buffer, zeros, freed blocks, and the rings' page once
 * their entries are aside. Adjacent ones go in one call. */
static void h2__give_back(h2_mem_t *m) {
  h2_pool_t *p = m->pool;
  size_t from = 0, to = 0; /* the run being gathered */
  for (int i = -1; i <= m->nblocks; i++) {
    bool go = false;
    size_t off = 0, end = 0;
    if (i < 0) { /* the rings' page, as one */
      if (!m->nrings) continue;
      end = p->page;
      go = h2__rings_save(m);
    } else if (i < m->nblocks) {
      h2_block_t *b = &m->blocks[i];
      if (b->kind == H2_BLOCK_RING) continue;
      off = b->off;
      end = h2__round(b->off + b->len, p->page);
      go = b->kind == H2_BLOCK_DEAD || b->kind == H2_BLOCK_FRAMES ||
           h2__zero(m->slot + b->off, b->len);
    }
    if (go && to == off && to > from) {
      to = end; /* the run goes on */
      continue;
    }
    if (to > from) (void)madvise(m->slot + from, to - from, MADV_DONTNEED);
    from = to = 0;
    if (go) {
      from = off;
      to = end;
    }
  }
}

static void h2__sweep(mp_timer_t *t) {
  h2_pool_t *p = t->udata;
  for (h2_mem_t *m = p->warm, *next; m; m = next) {
    next = m->wnext;
    if (m->active || !h2__quiet(m)) { /* spoke since the last sweep, or
                                          has frames to send: next time */
      m->active = false;
      continue;
    }
    h2__give_back(m);
    h2__unwarm(m);
  }
  h2__release_free(p);
  if (!p->warm) { /* every session is quiet: nothing needs spares */
    h2__spares_free(p);
    timer_stop(reactor_timers(p->r), &p->sweep);
  }
}

void h2_mem_deinit(h2_mem_t *m) {
  h2_pool_t *p = m->pool;
  free(m->rings); /* (NULL: the session was woken for nghttp2_session_del) */
  m->rings = NULL;
  if (!m->slot) return;
  bool warm = m->warm;
  h2__unwarm(m);
  h2__slot_put(p, m->slot, warm);
  m->slot = NULL;
  if (--p->sessions == 0) { /* the lane may be ending: nothing stays armed */
    h2__release_free(p);
    h2__spares_free(p);
    timer_stop(reactor_timers(p->r), &p->sweep);
  }
}
