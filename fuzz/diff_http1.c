/* SPDX-License-Identifier: MIT */

/* diff_http1: parses the first request of each file with moonport's parser
 * (src/http/http1.h) and with Debian's http_parser 2.9, and compares.
 *
 *   diff_http1 DIR...      every regular file in each DIR
 *
 * Both must reject, or both accept with the same method, target, header
 * fields (names case-insensitively, values after trimming blanks) and body.
 * A disagreement listed in g_known (moonport stricter per RFC 9112, or a
 * limit or rule http1.h documents) is reported as a known difference and
 * passes; any other fails. The last line is "N passed, N failed", one count
 * per file. */
#include <dirent.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "http/http1.h"

#define DIFF_MAX_HEAD 8192 /* mp.http's default max_header */

/* ---- growable strings ---- */

typedef struct {
  char *p;
  size_t len, cap;
} str_t;

static void str_add(str_t *s, const char *p, size_t n) {
  if (s->len + n + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 64;
    while (cap < s->len + n + 1) cap *= 2;
    s->p = realloc(s->p, cap);
    if (!s->p) abort();
    s->cap = cap;
  }
  memcpy(s->p + s->len, p, n);
  s->len += n;
  s->p[s->len] = 0;
}

static void str_free(str_t *s) { free(s->p); }

/* ---- one parse, either side ---- */

#define DIFF_MAX_FIELDS 256

typedef struct {
  bool ok;         /* a whole request, head and body */
  char why[96];    /* if not: what went wrong */
  bool body_error; /* moonport: the head was fine, the chunked body not */
  int hp_errno;    /* http_parser: its error (HPE_OK if none) */
  str_t method, target, body;
  str_t name[DIFF_MAX_FIELDS], value[DIFF_MAX_FIELDS];
  int nfields;
} parsed_t;

static void parsed_free(parsed_t *r) {
  str_free(&r->method);
  str_free(&r->target);
  str_free(&r->body);
  for (int i = 0; i < r->nfields; i++) {
    str_free(&r->name[i]);
    str_free(&r->value[i]);
  }
}

/* ---- moonport ---- */

static void mp_body(const char *p, size_t n, void *arg) { str_add(arg, p, n); }

static void mp_parse(const char *buf, size_t len, parsed_t *r) {
  static http_request_t req;
  int rc = http_parse_head(buf, len, DIFF_MAX_HEAD, &req);
  if (rc <= 0) {
    snprintf(r->why, sizeof(r->why), "%s",
             rc == HTTP_NEED_MORE ? "incomplete head" : "");
    if (rc < 0) snprintf(r->why, sizeof(r->why), "head rejected, %d", -rc);
    return;
  }
  size_t head = (size_t)rc;
  str_add(&r->method, req.method, req.method_len);
  str_add(&r->target, req.target, req.target_len);
  for (int i = 0; i < req.nheaders && i < DIFF_MAX_FIELDS; i++) {
    str_add(&r->name[i], req.headers[i].name, req.headers[i].name_len);
    str_add(&r->value[i], req.headers[i].value, req.headers[i].value_len);
    r->nfields++;
  }
  if (req.chunked) {
    http_chunked_t c;
    http_chunked_init(&c, DIFF_MAX_HEAD);
    bool done = false;
    ssize_t n = http_chunked_feed(&c, buf + head, len - head, mp_body,
                                  &r->body, &done);
    if (n < 0) {
      snprintf(r->why, sizeof(r->why), "chunked body rejected");
      r->body_error = true;
      return;
    }
    if (!done) {
      snprintf(r->why, sizeof(r->why), "incomplete chunked body");
      return;
    }
  } else if (req.content_length > 0) {
    if ((uint64_t)req.content_length > len - head) {
      snprintf(r->why, sizeof(r->why), "incomplete body");
      return;
    }
    str_add(&r->body, buf + head, (size_t)req.content_length);
  }
  r->ok = true;
}

/* ---- http_parser ---- */

typedef struct {
  parsed_t *r;
  bool in_value, head_done, complete;
} hp_state_t;

static int hp_url(http_parser *p, const char *at, size_t n) {
  hp_state_t *s = p->data;
  str_add(&s->r->target, at, n);
  return 0;
}

static int hp_field(http_parser *p, const char *at, size_t n) {
  hp_state_t *s = p->data;
  if (s->head_done) return 0; /* a trailer: moonport skips those */
  parsed_t *r = s->r;
  if (s->in_value || r->nfields == 0) {
    if (r->nfields == DIFF_MAX_FIELDS) return 1;
    r->nfields++;
    s->in_value = false;
  }
  str_add(&r->name[r->nfields - 1], at, n);
  return 0;
}

static int hp_value(http_parser *p, const char *at, size_t n) {
  hp_state_t *s = p->data;
  if (s->head_done) return 0;
  s->in_value = true;
  str_add(&s->r->value[s->r->nfields - 1], at, n);
  return 0;
}

static int hp_headers_complete(http_parser *p) {
  hp_state_t *s = p->data;
  s->head_done = true;
  /* a field with no value at all still has one, empty */
  if (s->r->nfields && !s->in_value) str_add(&s->r->value[s->r->nfields - 1], "", 0);
  return 0;
}

static int hp_body(http_parser *p, const char *at, size_t n) {
  hp_state_t *s = p->data;
  str_add(&s->r->body, at, n);
  return 0;
}

static int hp_complete(http_parser *p) {
  hp_state_t *s = p->data;
  s->complete = true;
  http_parser_pause(p, 1); /* the first request only */
  return 0;
}

static void hp_parse(const char *buf, size_t len, parsed_t *r) {
  http_parser_settings set;
  http_parser_settings_init(&set);
  set.on_url = hp_url;
  set.on_header_field = hp_field;
  set.on_header_value = hp_value;
  set.on_headers_complete = hp_headers_complete;
  set.on_body = hp_body;
  set.on_message_complete = hp_complete;
  http_parser p;
  http_parser_init(&p, HTTP_REQUEST);
  hp_state_t s = {r, false, false, false};
  p.data = &s;
  http_parser_execute(&p, &set, buf, len);
  enum http_errno e = HTTP_PARSER_ERRNO(&p);
  r->hp_errno = (int)e;
  if (s.complete) {
    str_add(&r->method, http_method_str((enum http_method)p.method),
            strlen(http_method_str((enum http_method)p.method)));
    r->ok = true;
  } else if (e != HPE_OK) {
    snprintf(r->why, sizeof(r->why), "%s", http_errno_name(e));
  } else {
    snprintf(r->why, sizeof(r->why), "incomplete");
  }
}

/* ---- what the raw bytes say (for the known-difference table) ---- */

typedef struct {
  const char *reqline;
  size_t reqline_len;
  const char *line[DIFF_MAX_FIELDS]; /* field lines, CR stripped */
  size_t line_len[DIFF_MAX_FIELDS];
  int nlines;
  size_t head_len; /* 0: no empty line seen */
} raw_t;

static void raw_scan(const char *buf, size_t len, raw_t *w) {
  memset(w, 0, sizeof(*w));
  size_t p = 0;
  while (p < len && (buf[p] == '\r' || buf[p] == '\n')) p++;
  bool first = true;
  while (p < len) {
    const char *nl = memchr(buf + p, '\n', len - p);
    size_t end = nl ? (size_t)(nl - buf) : len;
    size_t cend = end > p && buf[end - 1] == '\r' ? end - 1 : end;
    if (first) {
      w->reqline = buf + p;
      w->reqline_len = cend - p;
      first = false;
    } else if (cend == p) {
      w->head_len = end + 1;
      return;
    } else if (w->nlines < DIFF_MAX_FIELDS) {
      w->line[w->nlines] = buf + p;
      w->line_len[w->nlines++] = cend - p;
    }
    p = end + 1;
  }
}

/* Field lines called `name` (blanks before the colon allowed). */
static int raw_count(const raw_t *w, const char *name) {
  size_t n = strlen(name);
  int count = 0;
  for (int i = 0; i < w->nlines; i++) {
    const char *l = w->line[i];
    size_t k = n;
    if (w->line_len[i] <= n || strncasecmp(l, name, n) != 0) continue;
    while (k < w->line_len[i] && (l[k] == ' ' || l[k] == '\t')) k++;
    if (k < w->line_len[i] && l[k] == ':') count++;
  }
  return count;
}

/* The value of the first field `name`, blanks trimmed, or NULL. */
static const char *raw_value(const raw_t *w, const char *name, size_t *vlen) {
  size_t n = strlen(name);
  for (int i = 0; i < w->nlines; i++) {
    const char *l = w->line[i];
    size_t e = w->line_len[i];
    if (e <= n || strncasecmp(l, name, n) != 0 || l[n] != ':') continue;
    size_t v = n + 1;
    while (v < e && (l[v] == ' ' || l[v] == '\t')) v++;
    while (e > v && (l[e - 1] == ' ' || l[e - 1] == '\t')) e--;
    *vlen = e - v;
    return l + v;
  }
  return NULL;
}

static bool raw_version(const raw_t *w, const char *v) {
  return w->reqline_len >= 8 &&
         memcmp(w->reqline + w->reqline_len - 8, v, 8) == 0;
}

/* ---- the known differences ---- */

typedef struct {
  const char *name;
  bool mp_rejects; /* the direction: moonport rejects, http_parser accepts */
  bool (*applies)(const raw_t *w, const parsed_t *mp, const parsed_t *hp);
  const char *reason;
} known_t;

static bool k_cl_te(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return raw_count(w, "content-length") && raw_count(w, "transfer-encoding");
}
static bool k_no_host(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return raw_version(w, "HTTP/1.1") && raw_count(w, "host") == 0;
}
static bool k_two_hosts(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return raw_count(w, "host") > 1;
}
static bool k_fold(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  for (int i = 0; i < w->nlines; i++)
    if (w->line[i][0] == ' ' || w->line[i][0] == '\t') return true;
  return false;
}
static bool k_te_10(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return raw_version(w, "HTTP/1.0") && raw_count(w, "transfer-encoding");
}
static bool k_te_other(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  size_t n;
  const char *v = raw_value(w, "transfer-encoding", &n);
  return raw_count(w, "transfer-encoding") > 1 ||
         (v && !(n == 7 && strncasecmp(v, "chunked", 7) == 0));
}
static bool k_chunk_framing(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return mp->body_error;
}
static bool k_spaces(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  const char *l = w->reqline;
  size_t n = w->reqline_len;
  for (size_t i = 0; i + 1 < n; i++)
    if (l[i] == ' ' && l[i + 1] == ' ') return true;
  return n && (l[0] == ' ' || l[n - 1] == ' ');
}
static bool k_space_colon(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  for (int i = 0; i < w->nlines; i++) {
    const char *c = memchr(w->line[i], ':', w->line_len[i]);
    if (c && c > w->line[i] && (c[-1] == ' ' || c[-1] == '\t')) return true;
  }
  return false;
}
static bool k_version(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return !raw_version(w, "HTTP/1.1") && !raw_version(w, "HTTP/1.0");
}
static bool k_too_large(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return w->head_len > DIFF_MAX_HEAD || w->nlines > HTTP_MAX_HEADERS;
}
static bool k_same_cl(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return raw_count(w, "content-length") > 1;
}
static bool k_method(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return hp->hp_errno == HPE_INVALID_METHOD;
}

static bool k_connect(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  return w->reqline_len >= 8 && memcmp(w->reqline, "CONNECT ", 8) == 0;
}
static bool k_target_bytes(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  for (size_t i = 0; i < w->reqline_len; i++)
    if ((unsigned char)w->reqline[i] >= 0x7f) return true;
  return false;
}
static bool k_host_value(const raw_t *w, const parsed_t *mp,
                   const parsed_t *hp) {
  size_t n;
  const char *v = raw_value(w, "host", &n);
  for (size_t i = 0; v && i < n; i++)
    if (strchr(" \t/?#@\"<>\\^`{|}", v[i]) || (unsigned char)v[i] >= 0x7f)
      return true;
  return false;
}

static const known_t g_known[] = {
    {"CL+TE", true, k_cl_te,
     "Content-Length with Transfer-Encoding is a smuggling vector; RFC 9112 6.1 lets a server reject it"},
    {"no Host", true, k_no_host,
     "RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without Host"},
    {"two Hosts", true, k_two_hosts,
     "RFC 9112 3.2: a server MUST answer 400 to more than one Host field line"},
    {"obs-fold", true, k_fold,
     "RFC 9112 5.2: a server MUST reject obs-fold or replace it; moonport rejects"},
    {"TE in 1.0", true, k_te_10,
     "RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 message means faulty framing"},
    {"TE not chunked", true, k_te_other,
     "RFC 9112 6.1, 7: only chunked is implemented; any other coding is 501 (http1.h)"},
    {"blank before colon", true, k_space_colon,
     "RFC 9112 5.1: a server MUST reject whitespace between a field name and the colon"},
    {"chunk framing", true, k_chunk_framing,
     "RFC 9112 7.1: chunk data ends with CRLF; http_parser (non-strict) skips any two bytes"},
    {"request-line spaces", true, k_spaces,
     "RFC 9112 3: the request line's parts are separated by exactly one SP"},
    {"version", true, k_version,
     "http1.h: only HTTP/1.0 and HTTP/1.1 (505 for others, 400 with no version)"},
    {"head limits", true, k_too_large,
     "http1.h: a head over max_head bytes or HTTP_MAX_HEADERS fields is 431"},
    {"equal Content-Lengths", false, k_same_cl,
     "RFC 9110 8.6 allows equal duplicates; http1.h rejects only ones that differ"},
    {"CONNECT", true, k_connect,
     "RFC 9110 9.3.6, 15.6.2: moonport doesn't tunnel, so CONNECT is 501 (Not Implemented)"},
    {"target bytes past ASCII", true, k_target_bytes,
     "RFC 9112 3.2: a request-target is visible ASCII; other bytes must be %-escaped (400)"},
    {"Host value", true, k_host_value,
     "RFC 9112 3.2, RFC 9110 7.2: a Host that is not uri-host[:port] is an invalid field value: 400"},
    {"method token", false, k_method,
     "RFC 9110 9.1, RFC 9112 3.1: a method is any token, case-sensitive; http_parser knows a fixed list"},
};

/* ---- comparing ---- */

static void trim(const str_t *s, const char **p, size_t *n) {
  const char *a = s->p ? s->p : "";
  size_t b = 0, e = s->len;
  while (b < e && (a[b] == ' ' || a[b] == '\t')) b++;
  while (e > b && (a[e - 1] == ' ' || a[e - 1] == '\t')) e--;
  *p = a + b;
  *n = e - b;
}

static bool str_eq(const str_t *a, const str_t *b) {
  return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

/* Empty if both agree, else what differs. */
static void compare(const parsed_t *m, const parsed_t *h, char *out, size_t n) {
  out[0] = 0;
  if (!str_eq(&m->method, &h->method)) {
    snprintf(out, n, "method %s vs %s", m->method.p, h->method.p);
  } else if (!str_eq(&m->target, &h->target)) {
    snprintf(out, n, "target \"%s\" vs \"%s\"", m->target.p, h->target.p);
  } else if (m->nfields != h->nfields) {
    snprintf(out, n, "%d fields vs %d", m->nfields, h->nfields);
  } else if (!str_eq(&m->body, &h->body)) {
    snprintf(out, n, "body of %zu bytes vs %zu", m->body.len, h->body.len);
  } else {
    for (int i = 0; i < m->nfields; i++) {
      const char *a, *b;
      size_t alen, blen;
      if (m->name[i].len != h->name[i].len ||
          strncasecmp(m->name[i].p, h->name[i].p, m->name[i].len) != 0) {
        snprintf(out, n, "field %d name %s vs %s", i, m->name[i].p,
                 h->name[i].p);
        return;
      }
      trim(&m->value[i], &a, &alen);
      trim(&h->value[i], &b, &blen);
      if (alen != blen || memcmp(a, b, alen) != 0) {
        snprintf(out, n, "field %s value \"%.*s\" vs \"%.*s\"", m->name[i].p,
                 (int)alen, a, (int)blen, b);
        return;
      }
    }
  }
}

static int g_passed, g_failed, g_known_seen;

static void check_file(const char *path, const char *label) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    printf("FAIL  %s: cannot open\n", label);
    g_failed++;
    return;
  }
  str_t in = {0};
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) str_add(&in, chunk, n);
  fclose(f);
  const char *buf = in.p ? in.p : "";

  static parsed_t m, h;
  memset(&m, 0, sizeof(m));
  memset(&h, 0, sizeof(h));
  mp_parse(buf, in.len, &m);
  hp_parse(buf, in.len, &h);

  if (!m.ok && !h.ok) {
    printf("ok    %s: both reject (moonport: %s; http_parser: %s)\n", label,
           m.why, h.why);
    g_passed++;
  } else if (m.ok && h.ok) {
    char what[256];
    compare(&m, &h, what, sizeof(what));
    if (!what[0]) {
      printf("ok    %s: both accept %s, %d fields, %zu body bytes\n", label,
             m.method.p, m.nfields, m.body.len);
      g_passed++;
    } else {
      printf("FAIL  %s: both accept but differ: %s\n", label, what);
      g_failed++;
    }
  } else {
    raw_t w;
    raw_scan(buf, in.len, &w);
    const known_t *k = NULL;
    for (size_t i = 0; i < sizeof(g_known) / sizeof(*g_known) && !k; i++)
      if (g_known[i].mp_rejects == !m.ok && g_known[i].applies(&w, &m, &h))
        k = &g_known[i];
    const char *side = m.ok ? "moonport accepts, http_parser rejects"
                            : "moonport rejects, http_parser accepts";
    const char *why = m.ok ? h.why : m.why;
    if (k) {
      printf("known %s: %s (%s): %s: %s\n", label, side, why, k->name,
             k->reason);
      g_passed++;
      g_known_seen++;
    } else {
      printf("FAIL  %s: %s (%s)\n", label, side, why);
      g_failed++;
    }
  }
  parsed_free(&m);
  parsed_free(&h);
  str_free(&in);
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR...\n", argv[0]);
    return 2;
  }
  for (int a = 1; a < argc; a++) {
    struct dirent **list;
    int n = scandir(argv[a], &list, NULL, by_name);
    if (n < 0) {
      printf("FAIL  %s: cannot read the directory\n", argv[a]);
      g_failed++;
      continue;
    }
    for (int i = 0; i < n; i++) {
      char path[4096];
      struct stat st;
      snprintf(path, sizeof(path), "%s/%s", argv[a], list[i]->d_name);
      if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
        check_file(path, list[i]->d_name);
      free(list[i]);
    }
    free(list);
  }
  printf("%d passed, %d failed (%d known differences among the passed)\n",
         g_passed, g_failed, g_known_seen);
  return g_failed ? 1 : 0;
}
