/* SPDX-License-Identifier: MIT */

/* pg_res: a query's result (pg.h's pg_res_*): rows copied out of libpq's
 * single-row results into one arena, the server's error, and the SQLSTATE
 * classes the metrics count errors by. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg/pg_int.h"

/* SQLSTATE classes, as Postgres 15's errcodes list them; "other" last. */
static const char *const pg_errclasses[] = {
    "00", "01", "02", "03", "08", "09", "0A", "0B", "0F", "0L", "0P",
    "0Z", "20", "21", "22", "23", "24", "25", "26", "27", "28", "2B",
    "2D", "2F", "34", "38", "39", "3B", "3D", "3F", "40", "42", "44",
    "53", "54", "55", "57", "58", "72", "F0", "HV", "P0", "XX", "other"};
_Static_assert(sizeof(pg_errclasses) / sizeof(pg_errclasses[0]) ==
                   STAT_PG_ERRCLASSES,
               "stats.h keeps a slot for each class");

const char *pg_errclass_name(int i) {
  return i >= 0 && i < STAT_PG_ERRCLASSES ? pg_errclasses[i] : NULL;
}

int pg_errclass_index(const char *sqlstate) {
  if (sqlstate && sqlstate[0] && sqlstate[1])
    for (int i = 0; i < STAT_PG_ERRCLASSES - 1; i++)
      if (pg_errclasses[i][0] == sqlstate[0] &&
          pg_errclasses[i][1] == sqlstate[1])
        return i;
  return STAT_PG_ERRCLASSES - 1;
}

/* ---- results ---- */

void pg_res_free(pg_res_t *r) {
  if (!r) return;
  free(r->data);
  free(r->off);
  free(r->len);
  PQclear(r->head);
  PQclear(r->err);
  free(r);
}

const char *pg_res_error(const pg_res_t *r) {
  return r->msg[0] ? r->msg : NULL;
}

const char *pg_res_diag(const pg_res_t *r, int field) {
  return r->err ? PQresultErrorField(r->err, field) : NULL;
}

int pg_res_nrows(const pg_res_t *r) { return r->nrows; }

int pg_res_ncols(const pg_res_t *r) { return r->head ? PQnfields(r->head) : 0; }

const char *pg_res_colname(const pg_res_t *r, int col) {
  return PQfname(r->head, col);
}

unsigned pg_res_coltype(const pg_res_t *r, int col) {
  return (unsigned)PQftype(r->head, col);
}

const char *pg_res_value(const pg_res_t *r, int row, int col, size_t *len) {
  size_t i = (size_t)row * (size_t)r->ncols + (size_t)col;
  if (r->len[i] < 0) {
    *len = 0;
    return NULL;
  }
  *len = (size_t)r->len[i];
  return r->data ? r->data + r->off[i] : ""; /* no bytes yet: all empty */
}

long long pg_res_affected(const pg_res_t *r) {
  const char *s = r->head ? PQcmdTuples(r->head) : "";
  return *s ? strtoll(s, NULL, 10) : -1;
}

pg_res_t *pg__res_new(void) { return calloc(1, sizeof(pg_res_t)); }

/* Bytes the rows hold. */
static size_t res_bytes(const pg_res_t *r) {
  return r->dcap + r->vcap * (sizeof(size_t) + sizeof(int32_t));
}

static void res_drop_rows(pg_res_t *r) {
  free(r->data);
  free(r->off);
  free(r->len);
  r->data = NULL;
  r->off = NULL;
  r->len = NULL;
  r->used = r->dcap = r->nvals = r->vcap = 0;
  r->nrows = 0;
}

/* Copies x's rows in. 0, -E2BIG (past max: the rows so far dropped, the
 * message set), -ENOMEM. */
int pg__res_add_rows(pg_res_t *r, const PGresult *x, size_t max) {
  int n = PQntuples(x), nf = PQnfields(x);
  if (r->nrows == 0) r->ncols = nf;
  if (nf != r->ncols) return -ENOMEM; /* cannot happen within one query */
  for (int i = 0; i < n; i++) {
    size_t bytes = 0;
    for (int f = 0; f < nf; f++) bytes += (size_t)PQgetlength(x, i, f);
    if (r->nvals + (size_t)nf > r->vcap) {
      size_t nc = r->vcap ? r->vcap * 2 : 64;
      while (nc < r->nvals + (size_t)nf) nc *= 2;
      size_t *no = realloc(r->off, nc * sizeof(size_t));
      if (!no) return -ENOMEM;
      r->off = no;
      int32_t *nl = realloc(r->len, nc * sizeof(int32_t));
      if (!nl) return -ENOMEM;
      r->len = nl;
      r->vcap = nc;
    }
    if (r->used + bytes > r->dcap) {
      size_t nc = r->dcap ? r->dcap * 2 : 1024;
      while (nc < r->used + bytes) nc *= 2;
      char *nd = realloc(r->data, nc);
      if (!nd) return -ENOMEM;
      r->data = nd;
      r->dcap = nc;
    }
    if (res_bytes(r) > max) {
      snprintf(r->msg, sizeof(r->msg),
               "result larger than max_result (%zu bytes)", max);
      res_drop_rows(r);
      return -E2BIG;
    }
    for (int f = 0; f < nf; f++) {
      size_t k = r->nvals++;
      if (PQgetisnull(x, i, f)) {
        r->len[k] = -1;
        r->off[k] = 0;
        continue;
      }
      int l = PQgetlength(x, i, f);
      r->off[k] = r->used;
      r->len[k] = l;
      if (l > 0) memcpy(r->data + r->used, PQgetvalue(x, i, f), (size_t)l);
      r->used += (size_t)l;
    }
    r->nrows++;
  }
  return 0;
}

/* The server's error as one line: "ERROR 23505: message". */
void pg__res_set_server_error(pg_res_t *r, PGresult *x) {
  const char *sev = PQresultErrorField(x, PG_DIAG_SEVERITY_NONLOCALIZED);
  const char *code = PQresultErrorField(x, PG_DIAG_SQLSTATE);
  const char *m = PQresultErrorField(x, PG_DIAG_MESSAGE_PRIMARY);
  if (!m) m = PQresultErrorMessage(x);
  snprintf(r->msg, sizeof(r->msg), "%s %s: %s", sev ? sev : "ERROR",
           code ? code : "XX000", m && *m ? m : "unknown error");
  size_t n = strlen(r->msg);
  while (n && (r->msg[n - 1] == '\n' || r->msg[n - 1] == ' ')) r->msg[--n] = 0;
  PQclear(r->err);
  r->err = x;
}
