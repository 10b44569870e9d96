/* SPDX-License-Identifier: MIT */

/* tls: OpenSSL 3 under a connection, through a BIO of our own (see
 * tls.h). The BIO reads from the bytes the reactor fed and writes records
 * to the reactor's out function, so OpenSSL never makes a system call. */
#include "net/tls.h"

#include <errno.h>
#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the process: OpenSSL, the ticket ratchet, our BIO type ---- */

/* Session-ticket keys come from a forward-only ratchet: the secret of
 * period p+1 is HMAC(secret of p, "next"), and the old one is erased.
 * Every process forked from the root starts from the secret of the
 * period it was forked in (the root moves its own on before each fork)
 * and moves forward by the clock alone, so all workers agree without a
 * message. A process keeps only the current secret and the previous
 * period's base key (tickets are taken for two periods): memory read from
 * a worker decrypts the tickets of those two periods and of the periods
 * after, until a reload, which starts a fresh random secret
 * (net_tls_reseed), but never a ticket from before the previous period.
 * The state lives in a page of its own kept out of core dumps. */
typedef struct {
  pthread_mutex_t lock;
  uint64_t period;             /* the period `secret` is for */
  unsigned char secret[32];    /* S_period */
  unsigned char prev_base[32]; /* the base key of period - 1 */
  bool have_prev;
  uint64_t seeds; /* bumped by every seed: older cached keys are stale */
} tls_ratchet_t;
static tls_ratchet_t *tls_ratchet;
static BIO_METHOD *tls_bio_method;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_init_rc;

/* A page (or more) of memory kept out of core dumps, or NULL. */
static void *tls__secret_page(size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  (void)madvise(p, size, MADV_DONTDUMP); /* best effort: old kernels */
  return p;
}

static void tls__secret_unmap(void *p, size_t size) {
  if (!p) return;
  OPENSSL_cleanse(p, size);
  munmap(p, size);
}

/* HMAC-SHA256(key, label || extra) into out (32 bytes); false on failure. */
static bool tls__hmac(const unsigned char key[32], const char *label,
                      const unsigned char *extra, size_t extra_len,
                      unsigned char out[32]) {
  unsigned char msg[96];
  size_t n = strlen(label);
  if (n + extra_len > sizeof(msg)) return false;
  memcpy(msg, label, n);
  if (extra_len) memcpy(msg + n, extra, extra_len);
  unsigned int outlen = 32;
  bool ok = HMAC(EVP_sha256(), key, 32, msg, n + extra_len, out, &outlen) &&
            outlen == 32;
  OPENSSL_cleanse(msg, sizeof(msg));
  return ok;
}

static uint64_t tls__period_now(void) {
  return (uint64_t)time(NULL) / NET_TLS_TICKET_PERIOD;
}

/* Moves the ratchet to period `now` (lock held); never backwards. */
static bool tls__advance(uint64_t now) {
  tls_ratchet_t *r = tls_ratchet;
  while (r->period < now) {
    unsigned char next[32];
    if (!tls__hmac(r->secret, "moonport base", NULL, 0, r->prev_base) ||
        !tls__hmac(r->secret, "moonport next", NULL, 0, next)) {
      OPENSSL_cleanse(next, sizeof(next));
      return false;
    }
    memcpy(r->secret, next, sizeof(next));
    OPENSSL_cleanse(next, sizeof(next));
    r->have_prev = true;
    r->period++;
  }
  return true;
}

/* A fresh random secret for this period (lock held); the old state is
 * erased. */
static bool tls__seed(void) {
  tls_ratchet_t *r = tls_ratchet;
  OPENSSL_cleanse(r->prev_base, sizeof(r->prev_base));
  r->have_prev = false;
  r->period = tls__period_now();
  r->seeds++;
  return RAND_priv_bytes(r->secret, sizeof(r->secret)) == 1;
}

/* Before a fork the parent moves on to this period, so a child never
 * holds an older secret; the lock is held across the fork. */
static void tls__fork_prepare(void) {
  pthread_mutex_lock(&tls_ratchet->lock);
  (void)tls__advance(tls__period_now());
}
static void tls__fork_parent(void) { pthread_mutex_unlock(&tls_ratchet->lock); }
static void tls__fork_child(void) { pthread_mutex_unlock(&tls_ratchet->lock); }

static int tls__bio_write(BIO *b, const char *data, int len);
static int tls__bio_read(BIO *b, char *buf, int len);
static long tls__bio_ctrl(BIO *b, int cmd, long num, void *ptr);

static void tls__init_once(void) {
  if (OPENSSL_init_ssl(OPENSSL_INIT_LOAD_SSL_STRINGS |
                           OPENSSL_INIT_LOAD_CRYPTO_STRINGS,
                       NULL) != 1 ||
      !(tls_ratchet = tls__secret_page(sizeof(*tls_ratchet))) ||
      pthread_mutex_init(&tls_ratchet->lock, NULL) != 0 || !tls__seed() ||
      pthread_atfork(tls__fork_prepare, tls__fork_parent, tls__fork_child)) {
    tls_init_rc = -EIO;
    return;
  }
  tls_bio_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
                                "moonport connection");
  if (!tls_bio_method || !BIO_meth_set_write(tls_bio_method, tls__bio_write) ||
      !BIO_meth_set_read(tls_bio_method, tls__bio_read) ||
      !BIO_meth_set_ctrl(tls_bio_method, tls__bio_ctrl)) {
    tls_init_rc = -ENOMEM;
    return;
  }
}

int net_tls_global_init(void) {
  pthread_once(&tls_once, tls__init_once);
  return tls_init_rc;
}

int net_tls_reseed(void) {
  int rc = net_tls_global_init();
  if (rc) return rc;
  pthread_mutex_lock(&tls_ratchet->lock);
  rc = tls__seed() ? 0 : -EIO;
  pthread_mutex_unlock(&tls_ratchet->lock);
  return rc;
}

/* The most telling error on OpenSSL's queue as "what: reason": the first
 * that is not a library's generic "PEM lib" / "system lib" wrapper. The
 * queue is cleared after. */
static void tls__errstr(char *out, size_t len, const char *what) {
  const char *pick = NULL, *last = NULL;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    const char *r = ERR_reason_error_string(e);
    if (!r) continue;
    last = r;
    if (!pick && strcmp(r, "PEM lib") != 0 && strcmp(r, "system lib") != 0)
      pick = r;
  }
  if (!pick) pick = last;
  if (pick)
    snprintf(out, len, "%s: %s", what, pick);
  else
    snprintf(out, len, "%s", what);
}

/* ---- contexts ---- */

typedef struct {
  SSL_CTX *ctx;
  char **names;
  size_t nnames;
} tls_cert_ctx_t;

struct net_tls_ctx {
  _Atomic int refs;
  bool server;
  tls_cert_ctx_t *certs; /* server: [0] is the default */
  size_t ncerts;
  SSL_CTX *client; /* client */
};

/* The ciphers of TLS 1.2 (1.3's are all AEAD and forward secret): ECDHE
 * with AES-GCM or ChaCha20, as Mozilla's "intermediate" profile. */
static const char tls_ciphers12[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

/* A certificate's ticket keys for the current and the last period, in
 * a page of their own (tls__secret_page), made under the ratchet's lock
 * from that period's base key and the certificate's session id context:
 * a ticket one certificate issued does not even decrypt under another. */
typedef struct {
  uint64_t period, seed; /* the period, and the ratchet's seeds then */
  bool set;
  unsigned char name[32], aes[32], mac[32];
} tls_keys_t;
typedef struct {
  tls_keys_t keys[2];
  unsigned char sid[32]; /* the session id context */
} tls_cert_keys_t;

/* Copies certificate ck's keys for `period` into out (lock taken here).
 * False when that period's key is gone (older than the last period, or a
 * clock that went back) or a derivation failed. */
static bool tls__keys(tls_cert_keys_t *ck, uint64_t period, tls_keys_t *out) {
  tls_ratchet_t *r = tls_ratchet;
  bool ok = false;
  pthread_mutex_lock(&r->lock);
  tls_keys_t *k = &ck->keys[period & 1];
  if (tls__advance(tls__period_now())) {
    if (k->set && k->period == period && k->seed == r->seeds) {
      ok = true;
    } else {
      unsigned char base[32];
      bool have = true;
      if (period == r->period)
        have = tls__hmac(r->secret, "moonport base", NULL, 0, base);
      else if (period + 1 == r->period && r->have_prev)
        memcpy(base, r->prev_base, sizeof(base));
      else
        have = false;
      ok = have && tls__hmac(base, "moonport name", ck->sid, 32, k->name) &&
           tls__hmac(base, "moonport aes", ck->sid, 32, k->aes) &&
           tls__hmac(base, "moonport mac", ck->sid, 32, k->mac);
      OPENSSL_cleanse(base, sizeof(base));
      k->set = ok;
      k->period = period;
      k->seed = r->seeds;
    }
  }
  if (ok) *out = *k;
  pthread_mutex_unlock(&r->lock);
  return ok;
}

/* Session tickets: encrypted with this period's key, taken with this
 * period's or the last one's, and every resumption gets a new one. The key
 * name says which period (and certificate) made it. */
static int tls__ticket_cb(SSL *s, unsigned char key_name[16],
                          unsigned char *iv, EVP_CIPHER_CTX *cctx,
                          EVP_MAC_CTX *hctx, int enc) {
  tls_cert_keys_t *ck = SSL_CTX_get_app_data(SSL_get_SSL_CTX(s));
  if (!ck) return enc ? -1 : 0;
  uint64_t now = tls__period_now();
  tls_keys_t k;
  int rc = enc ? 1 : 2;
  if (!enc) {
    if (!tls__keys(ck, now, &k) || memcmp(k.name, key_name, 16) != 0) {
      if (!tls__keys(ck, now - 1, &k) || memcmp(k.name, key_name, 16) != 0) {
        rc = 0; /* unknown: a full handshake */
        goto out;
      }
    }
  } else {
    if (!tls__keys(ck, now, &k)) {
      rc = -1;
      goto out;
    }
    memcpy(key_name, k.name, 16);
    if (RAND_bytes(iv, EVP_MAX_IV_LENGTH) != 1) {
      rc = -1;
      goto out;
    }
  }
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, k.mac,
                                        sizeof(k.mac)),
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, "SHA256", 0),
      OSSL_PARAM_construct_end()};
  if (enc) {
    if (EVP_EncryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, k.aes, iv) != 1)
      rc = -1;
  } else if (EVP_DecryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, k.aes, iv) !=
             1) {
    rc = -1;
  }
  if (rc != -1 && EVP_MAC_CTX_set_params(hctx, params) != 1) rc = -1;
  /* 2 on a decrypt: take it, and send a fresh ticket, so a client that
   * resumed can resume again (TLS 1.3 clients use a ticket once) */
out:
  OPENSSL_cleanse(&k, sizeof(k));
  return rc;
}

/* SNI: a name a certificate lists switches the connection to it; any
 * other name (or none) keeps the default. */
static bool tls__name_match(const char *pat, const char *name) {
  if (pat[0] == '*' && pat[1] == '.') {
    const char *dot = strchr(name, '.');
    return dot && dot != name && strcasecmp(dot + 1, pat + 2) == 0;
  }
  return strcasecmp(pat, name) == 0;
}

/* The certificate SNI `name` selects: the first that lists it, else the
 * default (0). */
static size_t tls__pick(const net_tls_ctx_t *c, const char *name) {
  for (size_t i = 0; i < c->ncerts; i++)
    for (size_t k = 0; k < c->certs[i].nnames; k++)
      if (tls__name_match(c->certs[i].names[k], name)) return i;
  return 0;
}

/* The certificate is chosen from the raw ClientHello, before OpenSSL
 * looks at a session: switching the SSL_CTX then also switches the
 * session id context (tls__server_one gives each certificate its own), so
 * a ticket (1.2) or PSK (1.3) is taken only under the certificate that
 * issued it, and a new session is made under the chosen one. The
 * servername callback would come too late for that: a TLS 1.2 session is
 * looked up before it runs. A malformed extension is left to OpenSSL. */
static int tls__hello_cb(SSL *s, int *al, void *arg) {
  (void)al;
  net_tls_ctx_t *c = arg;
  const unsigned char *p;
  size_t len;
  if (c->ncerts < 2 ||
      !SSL_client_hello_get0_ext(s, TLSEXT_TYPE_server_name, &p, &len))
    return SSL_CLIENT_HELLO_SUCCESS;
  /* ServerNameList: length(2), then name_type(1) = host_name, length(2),
   * the name */
  if (len < 5 || ((size_t)p[0] << 8 | p[1]) != len - 2 ||
      p[2] != TLSEXT_NAMETYPE_host_name)
    return SSL_CLIENT_HELLO_SUCCESS;
  size_t n = (size_t)p[3] << 8 | p[4];
  char name[256];
  if (n == 0 || n > len - 5 || n >= sizeof(name) || memchr(p + 5, 0, n))
    return SSL_CLIENT_HELLO_SUCCESS;
  memcpy(name, p + 5, n);
  name[n] = 0;
  size_t i = tls__pick(c, name);
  if (i) SSL_set_SSL_CTX(s, c->certs[i].ctx);
  return SSL_CLIENT_HELLO_SUCCESS;
}

/* SNI: the certificate was chosen by tls__hello_cb; answering OK
 * acknowledges the name (and keeps it in the session). */
static int tls__sni_cb(SSL *s, int *al, void *arg) {
  (void)s;
  (void)al;
  (void)arg;
  return SSL_TLSEXT_ERR_OK;
}

static int tls__alpn_cb(SSL *s, const unsigned char **out,
                        unsigned char *outlen, const unsigned char *in,
                        unsigned int inlen, void *arg) {
  (void)s;
  const unsigned char *ours = arg; /* the listener's list, wire format */
  unsigned char *sel;
  if (SSL_select_next_proto(&sel, outlen, ours, (unsigned)strlen(arg), in,
                            inlen) != OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_NOACK; /* h2 only, say: go on without ALPN */
  *out = sel;
  return SSL_TLSEXT_ERR_OK;
}

/* The settings every SSL_CTX of ours shares. */
static bool tls__common(SSL_CTX *ctx) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  /* Idle connections give their 16 KiB+ read and write buffers back. */
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                               SSL_OP_CIPHER_SERVER_PREFERENCE);
  /* TLS 1.3: AES-128-GCM first (as strong as needed, and a third cheaper
   * per byte than AES-256 with AES-NI), our order over the client's. */
  return SSL_CTX_set_cipher_list(ctx, tls_ciphers12) == 1 &&
         SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:"
                                       "TLS_CHACHA20_POLY1305_SHA256:"
                                       "TLS_AES_256_GCM_SHA384") == 1;
}

static SSL_CTX *tls__server_one(const net_tls_cert_t *ct, net_tls_ctx_t *c,
                                const char *alpn, char *err, size_t errlen) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx || !tls__common(ctx)) {
    tls__errstr(err, errlen, "tls: cannot make a context");
    SSL_CTX_free(ctx);
    return NULL;
  }
  char what[300];
  const char *files[] = {ct->cert, ct->key, ct->chain};
  const char *kinds[] = {"certificate", "key", "chain"};
  for (int i = 0; i < 3; i++) { /* a missing file says so plainly */
    if (files[i] && access(files[i], R_OK) != 0) {
      snprintf(err, errlen, "tls: %s %s: %s", kinds[i], files[i],
               strerror(errno));
      SSL_CTX_free(ctx);
      return NULL;
    }
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, ct->cert) != 1) {
    snprintf(what, sizeof(what), "tls: certificate %s", ct->cert);
    goto fail;
  }
  if (ct->chain) {
    /* extra intermediates in a file of their own */
    BIO *b = BIO_new_file(ct->chain, "r");
    X509 *x;
    int added = 0;
    while (b && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)))
      if (SSL_CTX_add_extra_chain_cert(ctx, x) != 1)
        X509_free(x);
      else
        added++;
    BIO_free(b);
    ERR_clear_error(); /* the end of the file reads as an error */
    if (!added) {
      snprintf(err, errlen, "tls: chain %s: no certificate in it", ct->chain);
      SSL_CTX_free(ctx);
      return NULL;
    }
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, ct->key, SSL_FILETYPE_PEM) != 1) {
    snprintf(what, sizeof(what), "tls: key %s", ct->key);
    goto fail;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    snprintf(what, sizeof(what), "tls: key %s does not match certificate %s",
             ct->key, ct->cert);
    goto fail;
  }
  /* A session belongs to the certificate that made it (RFC 6066, 3: not
   * resumed under another name's certificate; see tls__hello_cb) and to
   * the kind of listener (mp.http's, with ALPN, or mp.listen's): its id
   * context is a digest of the leaf certificate and that, the same in
   * every worker and after a reload, different for every other
   * certificate, and the ticket keys are derived from it. */
  tls_cert_keys_t *ck = tls__secret_page(sizeof(*ck));
  X509 *leaf = SSL_CTX_get0_certificate(ctx);
  unsigned char *der = NULL;
  int derlen = leaf ? i2d_X509(leaf, &der) : -1;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  unsigned int mdlen = 0;
  bool sid_ok =
      ck && derlen > 0 && md &&
      EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 &&
      EVP_DigestUpdate(md, alpn ? "moonport http" : "moonport tcp", 13) == 1 &&
      EVP_DigestUpdate(md, der, (size_t)derlen) == 1 &&
      EVP_DigestFinal_ex(md, ck->sid, &mdlen) == 1 && mdlen == 32 &&
      SSL_CTX_set_session_id_context(ctx, ck->sid, 32) == 1 &&
      SSL_CTX_set_app_data(ctx, ck) == 1;
  EVP_MD_CTX_free(md);
  OPENSSL_free(der);
  if (!sid_ok) {
    tls__secret_unmap(ck, sizeof(*ck));
    snprintf(what, sizeof(what), "tls: certificate %s: no session context",
             ct->cert);
    goto fail;
  }
  SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, tls__ticket_cb);
  SSL_CTX_set_timeout(ctx, 2 * NET_TLS_TICKET_PERIOD);
  /* Tickets only: no per-process session cache a ticket-less client would
   * need to come back to the same worker for. */
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ctx, 1);
  SSL_CTX_set_client_hello_cb(ctx, tls__hello_cb, c);
  SSL_CTX_set_tlsext_servername_callback(ctx, tls__sni_cb);
  SSL_CTX_set_tlsext_servername_arg(ctx, c);
  if (alpn) SSL_CTX_set_alpn_select_cb(ctx, tls__alpn_cb, (void *)alpn);
  return ctx;
fail:
  tls__errstr(err, errlen, what);
  SSL_CTX_free(ctx);
  return NULL;
}

static void tls__ctx_free(net_tls_ctx_t *c) {
  for (size_t i = 0; i < c->ncerts; i++) {
    if (c->certs[i].ctx)
      tls__secret_unmap(SSL_CTX_get_app_data(c->certs[i].ctx),
                        sizeof(tls_cert_keys_t));
    SSL_CTX_free(c->certs[i].ctx);
    for (size_t k = 0; k < c->certs[i].nnames; k++) free(c->certs[i].names[k]);
    free(c->certs[i].names);
  }
  free(c->certs);
  SSL_CTX_free(c->client);
  free(c);
}

net_tls_ctx_t *net_tls_server_ctx(const net_tls_cert_t *certs, size_t n,
                                  bool alpn_http, char *err, size_t errlen) {
  return net_tls_server_ctx_alpn(certs, n, alpn_http ? "\x08http/1.1" : NULL,
                                 err, errlen);
}

net_tls_ctx_t *net_tls_server_ctx_alpn(const net_tls_cert_t *certs, size_t n,
                                       const char *alpn, char *err,
                                       size_t errlen) {
  if (net_tls_global_init()) {
    snprintf(err, errlen, "tls: OpenSSL did not start");
    return NULL;
  }
  if (n == 0) {
    snprintf(err, errlen, "tls: no certificate");
    return NULL;
  }
  net_tls_ctx_t *c = calloc(1, sizeof(*c));
  if (c) c->certs = calloc(n, sizeof(*c->certs));
  if (!c || !c->certs) {
    free(c);
    snprintf(err, errlen, "tls: out of memory");
    return NULL;
  }
  atomic_init(&c->refs, 1);
  c->server = true;
  for (size_t i = 0; i < n; i++) {
    tls_cert_ctx_t *cc = &c->certs[i];
    c->ncerts = i + 1;
    cc->ctx = tls__server_one(&certs[i], c, alpn, err, errlen);
    if (!cc->ctx) goto fail;
    if (certs[i].nnames) {
      cc->names = calloc(certs[i].nnames, sizeof(char *));
      if (!cc->names) goto oom;
      for (size_t k = 0; k < certs[i].nnames; k++) {
        cc->nnames = k + 1;
        if (!(cc->names[k] = strdup(certs[i].names[k]))) goto oom;
      }
    }
  }
  return c;
oom:
  snprintf(err, errlen, "tls: out of memory");
fail:
  tls__ctx_free(c);
  return NULL;
}

net_tls_ctx_t *net_tls_client_ctx(const net_tls_client_opts_t *o, char *err,
                                  size_t errlen) {
  if (net_tls_global_init()) {
    snprintf(err, errlen, "tls: OpenSSL did not start");
    return NULL;
  }
  net_tls_ctx_t *c = calloc(1, sizeof(*c));
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (!c || !ctx || !tls__common(ctx)) {
    tls__errstr(err, errlen, "tls: cannot make a context");
    goto fail;
  }
  atomic_init(&c->refs, 1);
  c->client = ctx;
  if (o->verify) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    int ok = o->ca ? SSL_CTX_load_verify_locations(ctx, o->ca, NULL)
                   : SSL_CTX_set_default_verify_paths(ctx);
    if (ok != 1) {
      char what[300];
      snprintf(what, sizeof(what), "tls: ca %s", o->ca ? o->ca : "(system)");
      tls__errstr(err, errlen, what);
      goto fail;
    }
  }
  if ((o->cert != NULL) != (o->key != NULL)) {
    snprintf(err, errlen, "tls: a client certificate needs cert and key");
    goto fail;
  }
  if (o->cert) {
    char what[300];
    if (SSL_CTX_use_certificate_chain_file(ctx, o->cert) != 1) {
      snprintf(what, sizeof(what), "tls: certificate %s", o->cert);
      tls__errstr(err, errlen, what);
      goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, o->key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      snprintf(what, sizeof(what), "tls: key %s", o->key);
      tls__errstr(err, errlen, what);
      goto fail;
    }
  }
  if (o->alpn) {
    size_t n = strlen(o->alpn);
    unsigned char wire[64];
    if (n == 0 || n > 62) {
      snprintf(err, errlen, "tls: bad alpn");
      goto fail;
    }
    wire[0] = (unsigned char)n;
    memcpy(wire + 1, o->alpn, n);
    SSL_CTX_set_alpn_protos(ctx, wire, (unsigned)n + 1);
  }
  return c;
fail:
  if (c) c->client = NULL;
  SSL_CTX_free(ctx);
  free(c);
  return NULL;
}

static pthread_once_t tls_default_once = PTHREAD_ONCE_INIT;
static net_tls_ctx_t *tls_default;
static char tls_default_err[200];

static void tls__default_once(void) {
  net_tls_client_opts_t o = {.verify = true};
  tls_default = net_tls_client_ctx(&o, tls_default_err,
                                   sizeof(tls_default_err));
}

net_tls_ctx_t *net_tls_client_default(char *err, size_t errlen) {
  pthread_once(&tls_default_once, tls__default_once);
  if (!tls_default) snprintf(err, errlen, "%s", tls_default_err);
  return tls_default;
}

void net_tls_ctx_ref(net_tls_ctx_t *ctx) {
  atomic_fetch_add_explicit(&ctx->refs, 1, memory_order_relaxed);
}

void net_tls_ctx_unref(net_tls_ctx_t *ctx) {
  if (ctx && atomic_fetch_sub_explicit(&ctx->refs, 1, memory_order_acq_rel) ==
                 1)
    tls__ctx_free(ctx);
}

bool net_tls_ctx_is_server(const net_tls_ctx_t *ctx) { return ctx->server; }

/* ---- a connection ---- */

struct net_tls {
  SSL *ssl;
  net_tls_ctx_t *ctx;
  net_tls_out_fn out;
  void *arg;
  const char *in; /* fed bytes not read by OpenSSL yet */
  size_t in_len;
  char *stash; /* owned copy of them, when the reactor's buffer went */
  bool opened, told_open, failed, eof, sniffed, server;
  char err[160];
};

static int tls__bio_write(BIO *b, const char *data, int len) {
  net_tls_t *t = BIO_get_data(b);
  BIO_clear_retry_flags(b);
  if (len <= 0) return 0;
  return t->out(t->arg, data, (size_t)len) == 0 ? len : -1;
}

static int tls__bio_read(BIO *b, char *buf, int len) {
  net_tls_t *t = BIO_get_data(b);
  BIO_clear_retry_flags(b);
  if (t->in_len == 0) {
    BIO_set_retry_read(b);
    return -1;
  }
  size_t n = (size_t)len < t->in_len ? (size_t)len : t->in_len;
  memcpy(buf, t->in, n);
  t->in += n;
  t->in_len -= n;
  if (t->in_len == 0 && t->stash) {
    free(t->stash);
    t->stash = NULL;
    t->in = NULL;
  }
  return (int)n;
}

static long tls__bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
  (void)b;
  (void)num;
  (void)ptr;
  switch (cmd) {
  case BIO_CTRL_FLUSH:
    return 1;
  case BIO_CTRL_PUSH:
  case BIO_CTRL_POP:
    return 0;
  default:
    return 0;
  }
}

/* An address is what inet_pton reads as one (the dotted quad, or IPv6):
 * "127.1", "2130706433" or "127.0.0.1." are names to it, and are checked
 * as names (which no certificate's DNS entry will match). */
static bool tls__is_ip(const char *h) {
  unsigned char a[16];
  return inet_pton(AF_INET, h, a) == 1 || inet_pton(AF_INET6, h, a) == 1;
}

net_tls_t *net_tls_new(net_tls_ctx_t *ctx, const char *host,
                       net_tls_out_fn out, void *arg) {
  net_tls_t *t = calloc(1, sizeof(*t));
  if (!t) return NULL;
  t->server = ctx->server;
  t->ssl = SSL_new(ctx->server ? ctx->certs[0].ctx : ctx->client);
  BIO *b = t->ssl ? BIO_new(tls_bio_method) : NULL;
  if (!b) {
    SSL_free(t->ssl);
    free(t);
    ERR_clear_error();
    return NULL;
  }
  BIO_set_data(b, t);
  BIO_set_init(b, 1);
  SSL_set_bio(t->ssl, b, b);
  t->ctx = ctx;
  net_tls_ctx_ref(ctx);
  t->out = out;
  t->arg = arg;
  if (ctx->server) {
    SSL_set_accept_state(t->ssl);
  } else {
    SSL_set_connect_state(t->ssl);
    if (host && *host) {
      /* A name we cannot check fails the connection at its first read:
       * the chain alone says nothing about whom we reached. */
      bool ip = tls__is_ip(host), ok = true;
      if (!ip) ok = SSL_set_tlsext_host_name(t->ssl, host) == 1;
      if (ok && (SSL_get_verify_mode(t->ssl) & SSL_VERIFY_PEER))
        ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), host) ==
                      1
                : SSL_set1_host(t->ssl, host) == 1;
      if (!ok) {
        ERR_clear_error();
        t->failed = true;
        snprintf(t->err, sizeof(t->err), "tls: cannot check the name %.80s",
                 host);
      }
    }
  }
  return t;
}

void net_tls_free(net_tls_t *t) {
  if (!t) return;
  SSL_free(t->ssl);
  net_tls_ctx_unref(t->ctx);
  free(t->stash);
  free(t);
}

void net_tls_feed(net_tls_t *t, const char *data, size_t len) {
  if (t->in_len) { /* cannot happen with the reactor's use; keep order */
    size_t n = t->in_len + len;
    char *s = malloc(n);
    if (!s) {
      t->failed = true;
      snprintf(t->err, sizeof(t->err), "tls: out of memory");
      return;
    }
    memcpy(s, t->in, t->in_len);
    memcpy(s + t->in_len, data, len);
    free(t->stash);
    t->stash = s;
    t->in = s;
    t->in_len = n;
    return;
  }
  t->in = data;
  t->in_len = len;
}

int net_tls_stash(net_tls_t *t) {
  if (!t->in_len || t->stash) return 0;
  char *s = malloc(t->in_len);
  if (!s) return -ENOMEM;
  memcpy(s, t->in, t->in_len);
  t->stash = s;
  t->in = s;
  return 0;
}

bool net_tls_has_input(const net_tls_t *t) {
  return !t->failed && !t->eof &&
         (t->in_len > 0 || (t->opened && SSL_has_pending(t->ssl)));
}

bool net_tls_has_failed(const net_tls_t *t) { return t->failed; }

bool net_tls_open(const net_tls_t *t) { return t->opened && !t->failed; }

/* The reason of a failed handshake or read, as one line. */
static void tls__fail(net_tls_t *t) {
  t->failed = true;
  long vr = SSL_get_verify_result(t->ssl);
  unsigned long e = ERR_peek_error();
  if (!t->server && vr != X509_V_OK) {
    snprintf(t->err, sizeof(t->err), "certificate verify failed: %s",
             X509_verify_cert_error_string(vr));
  } else if (e) {
    const char *r = ERR_reason_error_string(e);
    snprintf(t->err, sizeof(t->err), "tls: %s", r ? r : "handshake failed");
  } else {
    snprintf(t->err, sizeof(t->err), "tls: handshake failed");
  }
  ERR_clear_error();
}

ssize_t net_tls_read(net_tls_t *t, char *buf, size_t cap) {
  if (t->failed) return NET_TLS_FAIL;
  if (t->eof) return NET_TLS_EOF;
  if (t->server && !t->sniffed && t->in_len) {
    t->sniffed = true;
    /* A TLS record starts with 0x16 (handshake); a letter is most likely
     * a plaintext request sent to the TLS port. */
    unsigned char b = (unsigned char)t->in[0];
    if ((b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z')) {
      t->failed = true;
      snprintf(t->err, sizeof(t->err), "tls: plaintext on a TLS port");
      return NET_TLS_PLAIN;
    }
  }
  if (!t->opened) {
    int rc = SSL_do_handshake(t->ssl);
    if (rc != 1) {
      int e = SSL_get_error(t->ssl, rc);
      /* (a want puts nothing on the error queue; every failure clears
       * it, so it is empty before each call, as SSL_get_error needs) */
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return NET_TLS_WANT;
      tls__fail(t);
      return NET_TLS_FAIL;
    }
    t->opened = true;
  }
  if (!t->told_open) {
    t->told_open = true;
    return NET_TLS_OPENED;
  }
  /* Nothing new and nothing buffered (a partial record counts): a read
   * would only fail with a want, at the cost of a trip through OpenSSL. */
  if (t->in_len == 0 && !SSL_has_pending(t->ssl)) return NET_TLS_WANT;
  size_t got = 0;
  int n = SSL_read_ex(t->ssl, buf, cap, &got) ? 1 : 0;
  if (n == 1) return (ssize_t)got;
  int e = SSL_get_error(t->ssl, 0);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
    return NET_TLS_WANT;
  if (e == SSL_ERROR_ZERO_RETURN) {
    t->eof = true;
    return NET_TLS_EOF;
  }
  tls__fail(t);
  return NET_TLS_FAIL;
}

int net_tls_write(net_tls_t *t, const void *data, size_t len) {
  if (t->failed || !t->opened) return NET_TLS_FAIL;
  size_t done = 0;
  if (len == 0) return 0;
  if (SSL_write_ex(t->ssl, data, len, &done) == 1 && done == len) return 0;
  tls__fail(t);
  return NET_TLS_FAIL;
}

void net_tls_close_notify(net_tls_t *t) {
  if (t->failed || !t->opened) return;
  (void)SSL_shutdown(t->ssl);
  ERR_clear_error();
}

const char *net_tls_error(const net_tls_t *t) {
  return t->err[0] ? t->err : "tls: failed";
}

void net_tls_info(const net_tls_t *t, net_tls_info_t *info) {
  memset(info, 0, sizeof(*info));
  info->server = t->server;
  info->protocol = SSL_get_version(t->ssl);
  info->cipher = SSL_get_cipher_name(t->ssl);
  info->sni = SSL_get_servername(t->ssl, TLSEXT_NAMETYPE_host_name);
  const unsigned char *a = NULL;
  unsigned int alen = 0;
  SSL_get0_alpn_selected(t->ssl, &a, &alen);
  if (a && alen < sizeof(info->alpn)) {
    memcpy(info->alpn, a, alen);
    info->alpn[alen] = 0;
  }
  info->resumed = SSL_session_reused(t->ssl) == 1;
}

static pthread_once_t tls_ktls_once = PTHREAD_ONCE_INIT;
static bool tls_ktls;

static void tls__ktls_once(void) {
  FILE *f = fopen("/proc/sys/net/ipv4/tcp_available_ulp", "r");
  char line[256] = "";
  if (f) {
    if (!fgets(line, sizeof(line), f)) line[0] = 0;
    fclose(f);
  }
  for (char *w = strtok(line, " \n"); w; w = strtok(NULL, " \n"))
    if (strcmp(w, "tls") == 0) tls_ktls = true;
}

bool net_tls_kernel_available(void) {
  pthread_once(&tls_ktls_once, tls__ktls_once);
  return tls_ktls;
}
