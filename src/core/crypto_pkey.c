/* SPDX-License-Identifier: MIT */

/* crypto_pkey: RSA, ECDSA P-256 and Ed25519 keys and signatures for JWT
 * (crypto.h, "public-key signatures"). JWS writes an ECDSA signature as
 * r || s, 32 bytes each; libcrypto speaks DER: converted here both ways. */
#include "core/crypto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#define RSA_MIN_BITS 2048
#define RSA_MAX_BITS 8192

struct crypto_pkey {
  EVP_PKEY *k;
  int type;
  int priv;
};

/* Never asks for a passphrase: an encrypted key fails to load. */
static int no_pass(char *buf, int size, int rw, void *u) {
  (void)buf, (void)size, (void)rw, (void)u;
  return 0;
}

/* The CRYPTO_PKEY_* of k, or 0 for a type or curve JWT's algorithms
 * here don't use. */
static int type_of(EVP_PKEY *k) {
  switch (EVP_PKEY_get_base_id(k)) {
  case EVP_PKEY_RSA: {
    int bits = EVP_PKEY_get_bits(k);
    return bits >= RSA_MIN_BITS && bits <= RSA_MAX_BITS ? CRYPTO_PKEY_RSA : 0;
  }
  case EVP_PKEY_EC: {
    char name[64];
    size_t len;
    if (!EVP_PKEY_get_group_name(k, name, sizeof(name), &len)) return 0;
    return strcmp(name, "prime256v1") == 0 || strcmp(name, "P-256") == 0
               ? CRYPTO_PKEY_EC_P256
               : 0;
  }
  case EVP_PKEY_ED25519:
    return CRYPTO_PKEY_ED25519;
  default:
    return 0;
  }
}

static crypto_pkey_t *wrap(EVP_PKEY *k, int priv) {
  int type = type_of(k);
  if (!type) {
    EVP_PKEY_free(k);
    errno = EINVAL;
    return NULL;
  }
  crypto_pkey_t *p = malloc(sizeof(*p));
  if (!p) {
    EVP_PKEY_free(k);
    errno = ENOMEM;
    return NULL;
  }
  p->k = k;
  p->type = type;
  p->priv = priv;
  return p;
}

crypto_pkey_t *crypto_pkey_from_pem(const char *pem, size_t len) {
  if (len > INT32_MAX) {
    errno = EINVAL;
    return NULL;
  }
  EVP_PKEY *k = NULL;
  int priv = 0;
  BIO *b = BIO_new_mem_buf(pem, (int)len);
  if (!b) {
    errno = ENOMEM;
    return NULL;
  }
  if (memmem(pem, len, "PRIVATE KEY-----", 16)) {
    k = PEM_read_bio_PrivateKey(b, NULL, no_pass, NULL);
    priv = 1;
  } else if (memmem(pem, len, "-----BEGIN CERTIFICATE-----", 27)) {
    X509 *x = PEM_read_bio_X509(b, NULL, no_pass, NULL);
    if (x) {
      k = X509_get_pubkey(x);
      X509_free(x);
    }
  } else {
    k = PEM_read_bio_PUBKEY(b, NULL, no_pass, NULL);
  }
  BIO_free(b);
  ERR_clear_error();
  if (!k) {
    errno = EBADMSG;
    return NULL;
  }
  return wrap(k, priv);
}

/* A key from OSSL_PARAMs: "RSA" or "EC" public key data. */
static EVP_PKEY *from_params(const char *kind, OSSL_PARAM *params) {
  EVP_PKEY *k = NULL;
  EVP_PKEY_CTX *c = EVP_PKEY_CTX_new_from_name(NULL, kind, NULL);
  if (!c || EVP_PKEY_fromdata_init(c) <= 0 ||
      EVP_PKEY_fromdata(c, &k, EVP_PKEY_PUBLIC_KEY, params) <= 0)
    k = NULL;
  EVP_PKEY_CTX_free(c);
  return k;
}

crypto_pkey_t *crypto_pkey_from_jwk(int type, const uint8_t *a, size_t alen,
                                    const uint8_t *b, size_t blen) {
  EVP_PKEY *k = NULL;
  if (type == CRYPTO_PKEY_RSA) {
    if (alen < 1 || alen > RSA_MAX_BITS / 8 || blen < 1 || blen > 8) {
      errno = EINVAL;
      return NULL;
    }
    BIGNUM *n = BN_bin2bn(a, (int)alen, NULL), *e = BN_bin2bn(b, (int)blen, NULL);
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    OSSL_PARAM *params = NULL;
    if (n && e && bld && OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, n) &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, e))
      params = OSSL_PARAM_BLD_to_param(bld);
    if (params) k = from_params("RSA", params);
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(bld);
    BN_free(n);
    BN_free(e);
  } else if (type == CRYPTO_PKEY_EC_P256) {
    if (alen != 32 || blen != 32) {
      errno = EINVAL;
      return NULL;
    }
    uint8_t point[65];
    point[0] = 4; /* uncompressed */
    memcpy(point + 1, a, 32);
    memcpy(point + 33, b, 32);
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME,
                                         (char *)"prime256v1", 0),
        OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, point,
                                          sizeof(point)),
        OSSL_PARAM_construct_end()};
    k = from_params("EC", params);
  } else if (type == CRYPTO_PKEY_ED25519) {
    if (alen != 32) {
      errno = EINVAL;
      return NULL;
    }
    k = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, a, alen);
  } else {
    errno = EINVAL;
    return NULL;
  }
  ERR_clear_error();
  if (!k) {
    errno = EINVAL; /* a point off the curve, say */
    return NULL;
  }
  return wrap(k, 0);
}

int crypto_pkey_type(const crypto_pkey_t *k) { return k->type; }
int crypto_pkey_private(const crypto_pkey_t *k) { return k->priv; }

void crypto_pkey_free(crypto_pkey_t *k) {
  if (!k) return;
  EVP_PKEY_free(k->k);
  free(k);
}

static const EVP_MD *md_of(const crypto_pkey_t *k) {
  return k->type == CRYPTO_PKEY_ED25519 ? NULL : EVP_sha256();
}

int crypto_pkey_sign(crypto_pkey_t *k, const void *msg, size_t mlen,
                     uint8_t *out, size_t *outlen) {
  if (!k->priv) return -EINVAL;
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  if (!c) return -ENOMEM;
  int rc = -EIO;
  uint8_t der[80];
  size_t len = 0;
  if (EVP_DigestSignInit(c, NULL, md_of(k), NULL, k->k) <= 0 ||
      EVP_DigestSign(c, NULL, &len, msg, mlen) <= 0)
    goto done;
  if (k->type == CRYPTO_PKEY_EC_P256) {
    /* DER out, then r || s */
    if (len > sizeof(der)) goto done;
    if (EVP_DigestSign(c, der, &len, msg, mlen) <= 0) goto done;
    const uint8_t *p = der;
    ECDSA_SIG *sig = d2i_ECDSA_SIG(NULL, &p, (long)len);
    if (!sig) goto done;
    const BIGNUM *r, *s;
    ECDSA_SIG_get0(sig, &r, &s);
    if (*outlen < 64 || BN_bn2binpad(r, out, 32) != 32 ||
        BN_bn2binpad(s, out + 32, 32) != 32) {
      ECDSA_SIG_free(sig);
      goto done;
    }
    ECDSA_SIG_free(sig);
    *outlen = 64;
    rc = 0;
  } else {
    if (len > *outlen) goto done;
    if (EVP_DigestSign(c, out, &len, msg, mlen) <= 0) goto done;
    *outlen = len;
    rc = 0;
  }
done:
  EVP_MD_CTX_free(c);
  ERR_clear_error();
  return rc;
}

int crypto_pkey_verify(crypto_pkey_t *k, const void *msg, size_t mlen,
                       const uint8_t *sig, size_t slen) {
  uint8_t der[80];
  const uint8_t *s = sig;
  if (k->type == CRYPTO_PKEY_EC_P256) {
    if (slen != 64) return 0;
    ECDSA_SIG *es = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(sig, 32, NULL), *ss = BN_bin2bn(sig + 32, 32, NULL);
    if (!es || !r || !ss || !ECDSA_SIG_set0(es, r, ss)) {
      ECDSA_SIG_free(es);
      BN_free(r);
      BN_free(ss);
      return -ENOMEM;
    }
    uint8_t *p = der;
    int n = i2d_ECDSA_SIG(es, NULL);
    if (n <= 0 || (size_t)n > sizeof(der)) {
      ECDSA_SIG_free(es);
      return -EIO;
    }
    n = i2d_ECDSA_SIG(es, &p);
    ECDSA_SIG_free(es);
    if (n <= 0) return -EIO;
    s = der;
    slen = (size_t)n;
  } else if (k->type == CRYPTO_PKEY_ED25519 && slen != 64) {
    return 0;
  }
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  if (!c) return -ENOMEM;
  int rc = -EIO;
  if (EVP_DigestVerifyInit(c, NULL, md_of(k), NULL, k->k) > 0) {
    int v = EVP_DigestVerify(c, s, slen, msg, mlen);
    rc = v == 1 ? 1 : 0;
  }
  EVP_MD_CTX_free(c);
  ERR_clear_error();
  return rc;
}
