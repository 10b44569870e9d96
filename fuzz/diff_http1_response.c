/* SPDX-License-Identifier: MIT */

/* diff_http1_response: parses the response of each file with moonport's
 * response parser (src/http/http1_response.h, the body read by the
 * framing it decides) and with Debian's http_parser 2.9 in HTTP_RESPONSE
 * mode, and compares. The seeds are fuzz/corpus/http1_response/, in the
 * fuzz target's format: byte 0's low bit says the request was HEAD, the
 * rest is the response stream; interim 1xx responses are skipped, the
 * first final response is compared, and the end of the file is the
 * connection's close.
 *
 *   diff_http1_response DIR...
 *
 * Both must reject, or both accept with the same status, header fields
 * (names case-insensitively, values after trimming blanks), body and
 * keep-alive decision. A disagreement listed in g_known (moonport
 * stricter per RFC 9110/9112, or a limit http1_response.h documents) is
 * reported as a known difference and passes; any other fails. The last
 * line is "N passed, N failed", one count per file. */
#include <dirent.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "http/http1_response.h"

#define DIFF_MAX_HEAD 8192

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

static void str_clear(str_t *s) {
  s->len = 0;
  if (s->p) s->p[0] = 0;
}

static void str_free(str_t *s) { free(s->p); }

#define DIFF_MAX_FIELDS 256

typedef struct {
  bool ok;
  char why[96];
  bool body_error; /* moonport: the head was fine, the chunked body not */
  int status;
  bool keep_alive;
  str_t body;
  str_t name[DIFF_MAX_FIELDS], value[DIFF_MAX_FIELDS];
  int nfields;
} parsed_t;

static void parsed_free(parsed_t *r) {
  str_free(&r->body);
  for (int i = 0; i < DIFF_MAX_FIELDS; i++) {
    str_free(&r->name[i]);
    str_free(&r->value[i]);
  }
}

static void parsed_reset_fields(parsed_t *r) {
  for (int i = 0; i < r->nfields; i++) {
    str_clear(&r->name[i]);
    str_clear(&r->value[i]);
  }
  r->nfields = 0;
}

/* ---- moonport ---- */

static void mp_body(const char *p, size_t n, void *arg) { str_add(arg, p, n); }

static void mp_parse(const char *buf, size_t len, bool head, parsed_t *r) {
  static http_response_t res;
  int rc;
  size_t off = 0;
  for (;;) {
    rc = http_parse_response(buf + off, len - off, DIFF_MAX_HEAD, head, &res);
    if (rc <= 0) {
      snprintf(r->why, sizeof(r->why), "head %s",
               rc == HTTP_RES_INCOMPLETE ? "incomplete"
               : rc == HTTP_RES_TOO_LARGE ? "too large" : "rejected");
      return;
    }
    off += (size_t)rc;
    if (!res.interim) break;
  }
  const char *b = buf + off;
  size_t blen = len - off;
  r->status = res.status;
  r->keep_alive = res.keep_alive;
  for (int i = 0; i < res.nheaders && i < DIFF_MAX_FIELDS; i++) {
    str_add(&r->name[i], res.headers[i].name, res.headers[i].name_len);
    str_add(&r->value[i], res.headers[i].value, res.headers[i].value_len);
    r->nfields++;
  }
  switch (res.body) {
  case HTTP_BODY_NONE:
    break;
  case HTTP_BODY_LENGTH:
    if ((uint64_t)res.content_length > blen) {
      snprintf(r->why, sizeof(r->why), "incomplete body");
      return;
    }
    str_add(&r->body, b, (size_t)res.content_length);
    break;
  case HTTP_BODY_CHUNKED: {
    http_chunked_t c;
    http_chunked_init(&c, DIFF_MAX_HEAD);
    bool done = false;
    if (http_chunked_feed(&c, b, blen, mp_body, &r->body, &done) < 0) {
      snprintf(r->why, sizeof(r->why), "chunked body rejected");
      r->body_error = true;
      return;
    }
    if (!done) {
      snprintf(r->why, sizeof(r->why), "incomplete chunked body");
      return;
    }
    break;
  }
  case HTTP_BODY_CLOSE:
    str_add(&r->body, b, blen);
    break;
  }
  r->ok = true;
}

/* ---- http_parser ---- */

typedef struct {
  parsed_t *r;
  bool head, in_value, head_done, complete;
} hp_state_t;

static int hp_begin(http_parser *p) {
  hp_state_t *s = p->data;
  parsed_reset_fields(s->r); /* an interim response's fields are dropped */
  str_clear(&s->r->body);
  s->in_value = s->head_done = false;
  return 0;
}

static int hp_field(http_parser *p, const char *at, size_t n) {
  hp_state_t *s = p->data;
  if (s->head_done) return 0; /* a trailer */
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
  if (s->r->nfields && !s->in_value)
    str_add(&s->r->value[s->r->nfields - 1], "", 0);
  /* 1: no body follows (the answer to a HEAD) */
  return s->head && p->status_code >= 200 ? 1 : 0;
}

static int hp_body(http_parser *p, const char *at, size_t n) {
  hp_state_t *s = p->data;
  str_add(&s->r->body, at, n);
  return 0;
}

static int hp_complete(http_parser *p) {
  hp_state_t *s = p->data;
  if (p->status_code >= 100 && p->status_code < 200 && p->status_code != 101)
    return 0; /* interim: the final response follows */
  s->complete = true;
  s->r->status = p->status_code;
  /* after a 101 the connection is the new protocol's, not HTTP's: no
   * keep-alive, as http1_response.h has it */
  s->r->keep_alive = p->status_code != 101 && http_should_keep_alive(p);
  http_parser_pause(p, 1);
  return 0;
}

static void hp_parse(const char *buf, size_t len, bool head, parsed_t *r) {
  http_parser_settings set;
  http_parser_settings_init(&set);
  set.on_message_begin = hp_begin;
  set.on_header_field = hp_field;
  set.on_header_value = hp_value;
  set.on_headers_complete = hp_headers_complete;
  set.on_body = hp_body;
  set.on_message_complete = hp_complete;
  http_parser p;
  http_parser_init(&p, HTTP_RESPONSE);
  hp_state_t s = {r, head, false, false, false};
  p.data = &s;
  size_t n = http_parser_execute(&p, &set, buf, len);
  /* the file's end is the connection's close */
  if (!s.complete && HTTP_PARSER_ERRNO(&p) == HPE_OK && !p.upgrade)
    http_parser_execute(&p, &set, NULL, 0);
  enum http_errno e = HTTP_PARSER_ERRNO(&p);
  if (!s.complete && p.upgrade && n <= len) {
    /* 101: the parser stops at the end of the head */
    s.complete = true;
    r->status = p.status_code;
    r->keep_alive = false;
  }
  if (s.complete) {
    r->ok = true;
  } else if (e != HPE_OK) {
    snprintf(r->why, sizeof(r->why), "%s", http_errno_name(e));
  } else {
    snprintf(r->why, sizeof(r->why), "incomplete");
  }
}

/* ---- what the raw bytes say (for the known-difference table) ---- */

typedef struct {
  const char *status;
  size_t status_len;
  const char *line[DIFF_MAX_FIELDS];
  size_t line_len[DIFF_MAX_FIELDS];
  int nlines;
  size_t head_len;
} raw_t;

/* The first final response's head (interim heads skipped). */
static void raw_scan(const char *buf, size_t len, raw_t *w) {
  size_t p = 0;
  for (;;) {
    memset(w, 0, sizeof(*w));
    bool first = true;
    size_t start = p;
    while (p < len) {
      const char *nl = memchr(buf + p, '\n', len - p);
      size_t end = nl ? (size_t)(nl - buf) : len;
      size_t cend = end > p && buf[end - 1] == '\r' ? end - 1 : end;
      if (first) {
        w->status = buf + p;
        w->status_len = cend - p;
        first = false;
      } else if (cend == p) {
        w->head_len = end + 1 - start;
        p = end + 1;
        break;
      } else if (w->nlines < DIFF_MAX_FIELDS) {
        w->line[w->nlines] = buf + p;
        w->line_len[w->nlines++] = cend - p;
      }
      p = end + 1;
    }
    bool interim = w->status_len >= 12 && w->status[9] == '1' &&
                   !(w->status[10] == '0' && w->status[11] == '1');
    if (!w->head_len || !interim || p >= len) return;
  }
}

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

static int raw_code(const raw_t *w) {
  if (w->status_len < 12) return -1;
  return (w->status[9] - '0') * 100 + (w->status[10] - '0') * 10 +
         (w->status[11] - '0');
}

/* ---- the known differences ---- */

typedef struct {
  const char *name;
  bool mp_rejects;
  bool (*applies)(const raw_t *w, const parsed_t *mp, const parsed_t *hp,
                  bool head);
  const char *reason;
} known_t;

#define K(fn) static bool fn(const raw_t *w, const parsed_t *mp, \
                             const parsed_t *hp, bool head)
K(k_cl_te) { return raw_count(w, "content-length") && raw_count(w, "transfer-encoding"); }
K(k_fold) {
  for (int i = 0; i < w->nlines; i++)
    if (w->line[i][0] == ' ' || w->line[i][0] == '\t') return true;
  return false;
}
K(k_te_10) {
  return w->status_len >= 8 && memcmp(w->status, "HTTP/1.0", 8) == 0 &&
         raw_count(w, "transfer-encoding");
}
K(k_te_coding) {
  size_t n;
  const char *v = raw_value(w, "transfer-encoding", &n);
  if (raw_count(w, "transfer-encoding") > 1) return true;
  if (!v) return false;
  /* more than one coding, or none */
  return n == 0 || memchr(v, ',', n) != NULL;
}
K(k_space_colon) {
  for (int i = 0; i < w->nlines; i++) {
    const char *c = memchr(w->line[i], ':', w->line_len[i]);
    if (c && c > w->line[i] && (c[-1] == ' ' || c[-1] == '\t')) return true;
  }
  return false;
}
K(k_chunk_framing) { return mp->body_error; }
K(k_version) {
  return w->status_len < 8 || (memcmp(w->status, "HTTP/1.1", 8) != 0 &&
                               memcmp(w->status, "HTTP/1.0", 8) != 0);
}
K(k_status) {
  int c = raw_code(w);
  return c < 100 || c > 999 || w->status_len < 12 ||
         (w->status_len > 12 && w->status[12] != ' ');
}
K(k_reason_bytes) {
  for (size_t i = 12; i < w->status_len; i++) {
    unsigned char ch = (unsigned char)w->status[i];
    if ((ch < ' ' && ch != '\t') || ch == 0x7f) return true;
  }
  return false;
}
K(k_value_bytes) {
  for (int i = 0; i < w->nlines; i++)
    for (size_t k = 0; k < w->line_len[i]; k++) {
      unsigned char ch = (unsigned char)w->line[i][k];
      if ((ch < ' ' && ch != '\t') || ch == 0x7f) return true;
    }
  return false;
}
K(k_too_large) { return w->head_len > DIFF_MAX_HEAD || w->nlines > HTTP_RES_MAX_HEADERS; }
K(k_same_cl) { return raw_count(w, "content-length") > 1; }
K(k_no_body_status) {
  int c = raw_code(w);
  return c == 204 || c == 304;
}
K(k_invalid_cl) {
  size_t n;
  const char *v = raw_value(w, "content-length", &n);
  if (!v) return false;
  if (n == 0 || n > 18) return true;
  for (size_t i = 0; i < n; i++)
    if (v[i] < '0' || v[i] > '9') return true;
  return false;
}

static const known_t g_known[] = {
    {"CL+TE", true, k_cl_te,
     "RFC 9112 6.1/6.3: Content-Length with Transfer-Encoding is faulty framing (smuggling); refused"},
    {"obs-fold", true, k_fold,
     "RFC 9112 5.2: a client must unfold obs-fold before use; a zero-copy parser can't, so refuses"},
    {"TE in 1.0", true, k_te_10,
     "RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 message means faulty framing"},
    {"codings before chunked", true, k_te_coding,
     "http1_response.h: this client decodes no coding but chunked (and refuses an empty or repeated list)"},
    {"blank before colon", true, k_space_colon,
     "RFC 9112 5.1: whitespace between a field name and the colon must be rejected"},
    {"chunk framing", true, k_chunk_framing,
     "RFC 9112 7.1: chunk data ends with CRLF; http_parser (non-strict) skips any two bytes"},
    {"version", true, k_version,
     "http1_response.h: only HTTP/1.0 and HTTP/1.1 status lines"},
    {"status code", true, k_status,
     "RFC 9112 4: status-code is 3DIGIT (a client takes 100-999) followed by SP"},
    {"reason bytes", true, k_reason_bytes,
     "RFC 9112 4: reason-phrase is HTAB / SP / VCHAR / obs-text, no control bytes"},
    {"field value bytes", true, k_value_bytes,
     "RFC 9110 5.5: a field value holds no control bytes but HTAB"},
    {"head limits", true, k_too_large,
     "http1_response.h: a head over max_head bytes or HTTP_RES_MAX_HEADERS fields is refused"},
    {"invalid Content-Length", true, k_invalid_cl,
     "RFC 9110 8.6: Content-Length is 1*DIGIT (a list, even of equal values, is refused)"},
    {"equal Content-Lengths", false, k_same_cl,
     "RFC 9110 8.6 allows equal duplicates; http1_response.h refuses only ones that differ"},
    {"204/304 body", false, k_no_body_status,
     "RFC 9112 6.3 rule 1: a 204 or 304 never has content, whatever Content-Length says"},
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

static void compare(const parsed_t *m, const parsed_t *h, char *out, size_t n) {
  out[0] = 0;
  if (m->status != h->status) {
    snprintf(out, n, "status %d vs %d", m->status, h->status);
  } else if (m->nfields != h->nfields) {
    snprintf(out, n, "%d fields vs %d", m->nfields, h->nfields);
  } else if (!str_eq(&m->body, &h->body)) {
    snprintf(out, n, "body of %zu bytes vs %zu", m->body.len, h->body.len);
  } else if (m->keep_alive != h->keep_alive) {
    snprintf(out, n, "keep-alive %d vs %d", m->keep_alive, h->keep_alive);
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
  if (in.len == 0) {
    printf("FAIL  %s: empty (byte 0 is the HEAD flag)\n", label);
    g_failed++;
    return;
  }
  bool head = in.p[0] & 1;
  const char *buf = in.p + 1;
  size_t len = in.len - 1;

  static parsed_t m, h;
  memset(&m, 0, sizeof(m));
  memset(&h, 0, sizeof(h));
  mp_parse(buf, len, head, &m);
  hp_parse(buf, len, head, &h);

  if (!m.ok && !h.ok) {
    printf("ok    %s: both reject (moonport: %s; http_parser: %s)\n", label,
           m.why, h.why);
    g_passed++;
  } else {
    char what[256] = "";
    if (m.ok && h.ok) compare(&m, &h, what, sizeof(what));
    if (m.ok && h.ok && !what[0]) {
      printf("ok    %s: both accept %d, %d fields, %zu body bytes%s\n", label,
             m.status, m.nfields, m.body.len, m.keep_alive ? ", keep-alive" : "");
      g_passed++;
    } else if (m.ok && h.ok) {
      printf("FAIL  %s: both accept but differ: %s\n", label, what);
      g_failed++;
    } else {
      raw_t w;
      raw_scan(buf, len, &w);
      const known_t *k = NULL;
      for (size_t i = 0; i < sizeof(g_known) / sizeof(*g_known) && !k; i++)
        if (g_known[i].mp_rejects == !m.ok &&
            g_known[i].applies(&w, &m, &h, head))
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
