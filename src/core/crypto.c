/* SPDX-License-Identifier: MIT */

/* crypto: libcrypto's hashes, HMAC, KDFs and AES-GCM behind a small C
 * interface, plus the encodings (crypto.h).
 *
 * Speed: OpenSSL 3's one-shot calls (EVP_Digest, HMAC(), EVP_Q_mac) look
 * the algorithm up by name and allocate a context on every call; for the
 * short inputs a handler hashes that is most of the time. Here the
 * algorithms are fetched once per process and each thread keeps one
 * context per kind, re-initialised per call (EVP_MAC_init with a new key
 * re-keys an HMAC context without reallocating it). */
#include "core/crypto.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

static const struct {
  const char *name, *ossl;
  int len;
} algs[CRYPTO_NALG] = {
    [CRYPTO_MD5] = {"md5", "MD5", 16},
    [CRYPTO_SHA1] = {"sha1", "SHA1", 20},
    [CRYPTO_SHA224] = {"sha224", "SHA2-224", 28},
    [CRYPTO_SHA256] = {"sha256", "SHA2-256", 32},
    [CRYPTO_SHA384] = {"sha384", "SHA2-384", 48},
    [CRYPTO_SHA512] = {"sha512", "SHA2-512", 64},
};

/* Fetched once under fetch_once, read-only afterwards (any thread). */
static EVP_MD *g_md[CRYPTO_NALG];
static EVP_MAC *g_hmac;
static EVP_CIPHER *g_gcm;
static int g_fetch_rc;
static pthread_once_t fetch_once = PTHREAD_ONCE_INIT;

/* The calling thread's contexts, made on first use; freed by the key's
 * destructor when the thread ends. Only that thread touches them. */
typedef struct {
  EVP_MD_CTX *md;
  EVP_MAC_CTX *mac[CRYPTO_NALG];
  EVP_CIPHER_CTX *gcm;
} tctx_t;
static pthread_key_t tctx_key;

static void tctx_free(void *p) {
  tctx_t *t = p;
  EVP_MD_CTX_free(t->md);
  for (int i = 0; i < CRYPTO_NALG; i++) EVP_MAC_CTX_free(t->mac[i]);
  EVP_CIPHER_CTX_free(t->gcm);
  free(t);
}

static void fetch_all(void) {
  if (pthread_key_create(&tctx_key, tctx_free)) {
    g_fetch_rc = -ENOMEM;
    return;
  }
  for (int i = 0; i < CRYPTO_NALG; i++) {
    g_md[i] = EVP_MD_fetch(NULL, algs[i].ossl, NULL);
    if (!g_md[i]) g_fetch_rc = -EIO;
  }
  g_hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  g_gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
  if (!g_hmac || !g_gcm) g_fetch_rc = -EIO;
  ERR_clear_error();
}

int crypto_init(void) {
  pthread_once(&fetch_once, fetch_all);
  return g_fetch_rc;
}

/* The thread's contexts, or NULL (out of memory, or the key failed). */
static tctx_t *tctx(void) {
  pthread_once(&fetch_once, fetch_all);
  if (g_fetch_rc == -ENOMEM) return NULL;
  tctx_t *t = pthread_getspecific(tctx_key);
  if (t) return t;
  t = calloc(1, sizeof(*t));
  if (!t) return NULL;
  if (pthread_setspecific(tctx_key, t)) {
    free(t);
    return NULL;
  }
  return t;
}

/* libcrypto failed: its queue is cleared so the next caller sees only
 * its own errors. */
static int ossl_fail(void) {
  ERR_clear_error();
  return -EIO;
}

int crypto_alg(const char *name, size_t len) {
  for (int i = 0; i < CRYPTO_NALG; i++)
    if (strlen(algs[i].name) == len && memcmp(algs[i].name, name, len) == 0)
      return i;
  return -EINVAL;
}

int crypto_digest_len(int alg) {
  return alg >= 0 && alg < CRYPTO_NALG ? algs[alg].len : -EINVAL;
}

/* ---- hashes ---- */

int crypto_hash(int alg, const void *p, size_t n, uint8_t *out) {
  if (alg < 0 || alg >= CRYPTO_NALG) return -EINVAL;
  tctx_t *t = tctx();
  if (!t) return -ENOMEM;
  if (!g_md[alg]) return -EIO;
  if (!t->md && !(t->md = EVP_MD_CTX_new())) return -ENOMEM;
  unsigned int len;
  if (!EVP_DigestInit_ex2(t->md, g_md[alg], NULL) ||
      !EVP_DigestUpdate(t->md, p, n) || !EVP_DigestFinal_ex(t->md, out, &len))
    return ossl_fail();
  return (int)len;
}

int crypto_sha1(const void *p, size_t n, uint8_t out[20]) {
  return crypto_hash(CRYPTO_SHA1, p, n, out);
}

int crypto_sha256(const void *p, size_t n, uint8_t out[32]) {
  return crypto_hash(CRYPTO_SHA256, p, n, out);
}

struct crypto_hash {
  EVP_MD_CTX *ctx;
  int alg;
  int done; /* final was called */
};

crypto_hash_t *crypto_hash_new(int alg) {
  if (alg < 0 || alg >= CRYPTO_NALG) {
    errno = EINVAL;
    return NULL;
  }
  pthread_once(&fetch_once, fetch_all);
  if (!g_md[alg]) {
    errno = EIO;
    return NULL;
  }
  crypto_hash_t *h = calloc(1, sizeof(*h));
  if (!h || !(h->ctx = EVP_MD_CTX_new())) {
    free(h);
    errno = ENOMEM;
    return NULL;
  }
  h->alg = alg;
  if (crypto_hash_reset(h)) {
    crypto_hash_free(h);
    errno = EIO;
    return NULL;
  }
  return h;
}

int crypto_hash_reset(crypto_hash_t *h) {
  if (!EVP_DigestInit_ex2(h->ctx, g_md[h->alg], NULL)) return ossl_fail();
  h->done = 0;
  return 0;
}

int crypto_hash_update(crypto_hash_t *h, const void *p, size_t n) {
  if (h->done) return -EINVAL;
  return EVP_DigestUpdate(h->ctx, p, n) ? 0 : ossl_fail();
}

int crypto_hash_final(crypto_hash_t *h, uint8_t *out) {
  if (h->done) return -EINVAL;
  unsigned int len;
  h->done = 1;
  if (!EVP_DigestFinal_ex(h->ctx, out, &len)) return ossl_fail();
  return (int)len;
}

void crypto_hash_free(crypto_hash_t *h) {
  if (!h) return;
  EVP_MD_CTX_free(h->ctx);
  free(h);
}

/* ---- MACs and key derivation ---- */

int crypto_hmac(int alg, const void *key, size_t klen, const void *msg,
                size_t mlen, uint8_t *out) {
  if (alg < 0 || alg >= CRYPTO_NALG) return -EINVAL;
  tctx_t *t = tctx();
  if (!t) return -ENOMEM;
  if (!g_hmac) return -EIO;
  EVP_MAC_CTX *c = t->mac[alg];
  if (!c) {
    if (!(c = EVP_MAC_CTX_new(g_hmac))) return -ENOMEM;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST,
                                         (char *)algs[alg].ossl, 0),
        OSSL_PARAM_construct_end()};
    if (!EVP_MAC_CTX_set_params(c, params)) {
      EVP_MAC_CTX_free(c);
      return ossl_fail();
    }
    t->mac[alg] = c;
  }
  /* A NULL key would mean "the previous key" to EVP_MAC_init. */
  static const uint8_t empty[1];
  size_t len;
  if (!EVP_MAC_init(c, klen ? key : empty, klen, NULL) ||
      !EVP_MAC_update(c, msg, mlen) ||
      !EVP_MAC_final(c, out, &len, CRYPTO_MAX_DIGEST))
    return ossl_fail();
  return (int)len;
}

#define KDF_MAX_OUT (1024u * 1024)

int crypto_pbkdf2(int alg, const void *pass, size_t plen, const void *salt,
                  size_t slen, uint32_t iterations, uint8_t *out,
                  size_t outlen) {
  if (alg < 0 || alg >= CRYPTO_NALG || iterations < 1 ||
      iterations > 100000000 || outlen < 1 || outlen > KDF_MAX_OUT ||
      plen > INT32_MAX || slen > INT32_MAX)
    return -EINVAL;
  pthread_once(&fetch_once, fetch_all);
  if (!g_md[alg]) return -EIO;
  static const char empty[1];
  if (!PKCS5_PBKDF2_HMAC(plen ? pass : empty, (int)plen, salt ? salt : empty,
                         (int)slen, (int)iterations, g_md[alg], (int)outlen,
                         out))
    return ossl_fail();
  return 0;
}

int crypto_scrypt(const void *pass, size_t plen, const void *salt,
                  size_t slen, uint64_t N, uint32_t r, uint32_t p,
                  uint8_t *out, size_t outlen) {
  if (N < 2 || (N & (N - 1)) || r < 1 || p < 1 || outlen < 1 ||
      outlen > KDF_MAX_OUT)
    return -EINVAL;
  /* 128 N r for V, 128 r p for B, 256 r for XY: the bound libcrypto
   * checks against maxmem, computed here without overflow. */
  if (N > CRYPTO_SCRYPT_MAXMEM / 128 / r ||
      (uint64_t)p > CRYPTO_SCRYPT_MAXMEM / 128 / r)
    return -EINVAL;
  uint64_t need = 128 * N * r + 128ull * r * p + 256ull * r;
  if (need > CRYPTO_SCRYPT_MAXMEM) return -EINVAL;
  static const char empty[1];
  if (!EVP_PBE_scrypt(plen ? pass : empty, plen, salt ? salt : (void *)empty,
                      slen, N, r, p, need + 1024, out, outlen))
    return ossl_fail();
  return 0;
}

/* ---- random bytes and comparison ---- */

int crypto_random(void *out, size_t n) {
  uint8_t *p = out;
  while (n) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += got;
    n -= (size_t)got;
  }
  return 0;
}

int crypto_equal(const void *a, const void *b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

int crypto_uuid(int version, char out[36]) {
  uint8_t b[16];
  if (version != 4 && version != 7) return -EINVAL;
  int rc = crypto_random(b, sizeof(b));
  if (rc) return rc;
  if (version == 7) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    for (int i = 0; i < 6; i++) b[i] = (uint8_t)(ms >> (40 - 8 * i));
  }
  b[6] = (uint8_t)(version << 4 | (b[6] & 0x0f));
  b[8] = (uint8_t)(0x80 | (b[8] & 0x3f));
  char h[32];
  crypto_hex_encode(h, b, sizeof(b));
  memcpy(out, h, 8);
  out[8] = '-';
  memcpy(out + 9, h + 8, 4);
  out[13] = '-';
  memcpy(out + 14, h + 12, 4);
  out[18] = '-';
  memcpy(out + 19, h + 16, 4);
  out[23] = '-';
  memcpy(out + 24, h + 20, 12);
  return 0;
}

/* ---- AES-256-GCM ---- */

static int gcm(int enc, const uint8_t *key, const uint8_t *iv,
               const void *aad, size_t aadlen, const uint8_t *in, size_t n,
               uint8_t *out, uint8_t *tag) {
  if (n > INT32_MAX || aadlen > INT32_MAX) return -EINVAL;
  tctx_t *t = tctx();
  if (!t) return -ENOMEM;
  if (!g_gcm) return -EIO;
  if (!t->gcm && !(t->gcm = EVP_CIPHER_CTX_new())) return -ENOMEM;
  EVP_CIPHER_CTX *c = t->gcm;
  int len;
  if (!EVP_CipherInit_ex2(c, g_gcm, key, iv, enc, NULL)) return ossl_fail();
  if (!enc &&
      !EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, CRYPTO_GCM_TAG, tag))
    return ossl_fail();
  if (aadlen && !EVP_CipherUpdate(c, NULL, &len, aad, (int)aadlen))
    return ossl_fail();
  if (n && !EVP_CipherUpdate(c, out, &len, in, (int)n)) return ossl_fail();
  if (!EVP_CipherFinal_ex(c, out + n, &len)) {
    ERR_clear_error();
    return enc ? -EIO : -EBADMSG;
  }
  if (enc &&
      !EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, CRYPTO_GCM_TAG, tag))
    return ossl_fail();
  return 0;
}

int crypto_gcm_seal(const uint8_t key[CRYPTO_GCM_KEY],
                    const uint8_t iv[CRYPTO_GCM_IV], const void *aad,
                    size_t aadlen, const void *pt, size_t n, uint8_t *out) {
  return gcm(1, key, iv, aad, aadlen, pt, n, out, out + n);
}

int crypto_gcm_open(const uint8_t key[CRYPTO_GCM_KEY],
                    const uint8_t iv[CRYPTO_GCM_IV], const void *aad,
                    size_t aadlen, const uint8_t *ct, size_t n, uint8_t *out) {
  uint8_t tag[CRYPTO_GCM_TAG];
  memcpy(tag, ct + n, sizeof(tag));
  return gcm(0, key, iv, aad, aadlen, ct, n, out, tag);
}

/* ---- encodings ---- */

static const char b64_std[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static const char b64_url[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

size_t crypto_base64_len(size_t n, int flags) {
  if (flags & CRYPTO_B64_NOPAD) return n / 3 * 4 + (n % 3 ? n % 3 + 1 : 0);
  return (n + 2) / 3 * 4;
}

size_t crypto_base64_encode(char *out, const void *in, size_t n, int flags) {
  const char *a = flags & CRYPTO_B64_URL ? b64_url : b64_std;
  const uint8_t *s = in;
  char *o = out;
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
    o[0] = a[v >> 18];
    o[1] = a[(v >> 12) & 63];
    o[2] = a[(v >> 6) & 63];
    o[3] = a[v & 63];
    o += 4;
  }
  if (i < n) {
    uint32_t v = (uint32_t)s[i] << 16;
    if (i + 1 < n) v |= (uint32_t)s[i + 1] << 8;
    *o++ = a[v >> 18];
    *o++ = a[(v >> 12) & 63];
    if (i + 1 < n) *o++ = a[(v >> 6) & 63];
    if (!(flags & CRYPTO_B64_NOPAD)) {
      if (i + 1 >= n) *o++ = '=';
      *o++ = '=';
    }
  }
  return (size_t)(o - out);
}

/* 0..63, or 64 for a byte outside the alphabet; built once (any thread:
 * the tables are constant after pthread_once). */
static uint8_t dec_std[256], dec_url[256];
static pthread_once_t dec_once = PTHREAD_ONCE_INIT;

static void dec_build(void) {
  memset(dec_std, 64, sizeof(dec_std));
  memset(dec_url, 64, sizeof(dec_url));
  for (int i = 0; i < 64; i++) {
    dec_std[(uint8_t)b64_std[i]] = (uint8_t)i;
    dec_url[(uint8_t)b64_url[i]] = (uint8_t)i;
  }
}

long crypto_base64_decode(uint8_t *out, const char *in, size_t n, int flags) {
  pthread_once(&dec_once, dec_build);
  const uint8_t *d = flags & CRYPTO_B64_URL ? dec_url : dec_std;
  const uint8_t *s = (const uint8_t *)in;
  /* Padding, if any, makes the length a multiple of 4 with one or two
   * '=' at the end and nowhere else. */
  if (n % 4 == 0 && n && s[n - 1] == '=') {
    n--;
    if (s[n - 1] == '=') n--;
  }
  if (n % 4 == 1) return -EBADMSG;
  uint8_t *o = out;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t a = d[s[i]], b = d[s[i + 1]], c = d[s[i + 2]], e = d[s[i + 3]];
    if ((a | b | c | e) & 64) return -EBADMSG;
    uint32_t v = a << 18 | b << 12 | c << 6 | e;
    o[0] = (uint8_t)(v >> 16);
    o[1] = (uint8_t)(v >> 8);
    o[2] = (uint8_t)v;
    o += 3;
  }
  if (i < n) {
    uint32_t a = d[s[i]], b = d[s[i + 1]], c = i + 2 < n ? d[s[i + 2]] : 0;
    if ((a | b | c) & 64) return -EBADMSG;
    uint32_t v = a << 18 | b << 12 | c << 6;
    *o++ = (uint8_t)(v >> 16);
    if (i + 2 < n) *o++ = (uint8_t)(v >> 8);
  }
  return (long)(o - out);
}

size_t crypto_hex_encode(char *out, const void *in, size_t n) {
  static const char digits[] = "0123456789abcdef";
  const uint8_t *s = in;
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[s[i] >> 4];
    out[2 * i + 1] = digits[s[i] & 15];
  }
  return 2 * n;
}

static int hexval(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  c |= 0x20;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

long crypto_hex_decode(uint8_t *out, const char *in, size_t n) {
  if (n % 2) return -EBADMSG;
  for (size_t i = 0; i < n; i += 2) {
    int hi = hexval((uint8_t)in[i]), lo = hexval((uint8_t)in[i + 1]);
    if (hi < 0 || lo < 0) return -EBADMSG;
    out[i / 2] = (uint8_t)(hi << 4 | lo);
  }
  return (long)(n / 2);
}
