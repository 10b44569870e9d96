/* SPDX-License-Identifier: MIT */

/* Unit tests for src/core/crypto.h against published vectors (FIPS 180,
 * RFC 1321, RFC 4231, RFC 6070, RFC 7914, RFC 4648, the GCM spec's test
 * cases), the encoders' edge cases on guarded pages, and the one-shot
 * calls from several threads at once. */
#include "core/crypto.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#include <openssl/evp.h>
#include <openssl/pem.h>

static char g_hex[2 * 1024 + 1];

static const char *hex(const uint8_t *p, size_t n) {
  g_hex[crypto_hex_encode(g_hex, p, n)] = 0;
  return g_hex;
}

#define CHECK_HEX(p, n, want) CHECK(strcmp(hex(p, n), want) == 0)

static void test_hashes(void) {
  uint8_t out[CRYPTO_MAX_DIGEST];
  CHECK_EQ(crypto_hash(CRYPTO_MD5, "", 0, out), 16);
  CHECK_HEX(out, 16, "d41d8cd98f00b204e9800998ecf8427e");
  CHECK_EQ(crypto_hash(CRYPTO_MD5, "abc", 3, out), 16);
  CHECK_HEX(out, 16, "900150983cd24fb0d6963f7d28e17f72");
  CHECK_EQ(crypto_sha1("abc", 3, out), 20);
  CHECK_HEX(out, 20, "a9993e364706816aba3e25717850c26c9cd0d89d");
  CHECK_EQ(crypto_sha256("abc", 3, out), 32);
  CHECK_HEX(out, 32,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK_EQ(crypto_sha256(two, strlen(two), out), 32);
  CHECK_HEX(out, 32,
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK_EQ(crypto_hash(CRYPTO_SHA512, "abc", 3, out), 64);
  CHECK_HEX(out, 64,
            "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
            "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f");
  CHECK_EQ(crypto_hash(CRYPTO_SHA384, "abc", 3, out), 48);
  CHECK_HEX(out, 48,
            "cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed"
            "8086072ba1e7cc2358baeca134c825a7");
  CHECK_EQ(crypto_hash(CRYPTO_SHA224, "abc", 3, out), 28);
  CHECK_HEX(out, 28, "23097d223405d8228642a477bda255b32aadbce4bda0b3f7e36c9da7");
  CHECK_EQ(crypto_hash(CRYPTO_NALG, "abc", 3, out), -EINVAL);
  CHECK_EQ(crypto_hash(-1, "abc", 3, out), -EINVAL);

  CHECK_EQ(crypto_alg("sha256", 6), CRYPTO_SHA256);
  CHECK_EQ(crypto_alg("sha2567", 6), CRYPTO_SHA256);
  CHECK_EQ(crypto_alg("SHA256", 6), -EINVAL);
  CHECK_EQ(crypto_alg("sha", 3), -EINVAL);
  CHECK_EQ(crypto_digest_len(CRYPTO_SHA1), 20);
  CHECK_EQ(crypto_digest_len(99), -EINVAL);

  /* a million 'a' in uneven pieces, then reset and reuse */
  crypto_hash_t *h = crypto_hash_new(CRYPTO_SHA256);
  CHECK(h != NULL);
  static char a[1000];
  memset(a, 'a', sizeof(a));
  size_t left = 1000000, piece = 1;
  while (left) {
    size_t k = piece < left ? piece : left;
    CHECK(crypto_hash_update(h, a, k) == 0);
    left -= k;
    piece = piece * 7 % 997 + 1;
  }
  CHECK_EQ(crypto_hash_final(h, out), 32);
  CHECK_HEX(out, 32,
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  CHECK_EQ(crypto_hash_update(h, "x", 1), -EINVAL);
  CHECK_EQ(crypto_hash_final(h, out), -EINVAL);
  CHECK_EQ(crypto_hash_reset(h), 0);
  CHECK_EQ(crypto_hash_update(h, "abc", 3), 0);
  CHECK_EQ(crypto_hash_final(h, out), 32);
  CHECK_HEX(out, 32,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  crypto_hash_free(h);
  errno = 0;
  CHECK(crypto_hash_new(42) == NULL && errno == EINVAL);
  crypto_hash_free(NULL);
}

static void test_hmac(void) {
  uint8_t out[CRYPTO_MAX_DIGEST];
  uint8_t k1[20];
  memset(k1, 0x0b, sizeof(k1));
  /* RFC 4231 test case 1 */
  CHECK_EQ(crypto_hmac(CRYPTO_SHA256, k1, 20, "Hi There", 8, out), 32);
  CHECK_HEX(out, 32,
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK_EQ(crypto_hmac(CRYPTO_SHA512, k1, 20, "Hi There", 8, out), 64);
  CHECK_HEX(out, 64,
            "87aa7cdea5ef619d4ff0b4241a1d6cb02379f4e2ce4ec2787ad0b30545e17cde"
            "daa833b7d6b8a702038b274eaea3f4e4be9d914eeb61f1702e696c203a126854");
  /* test case 2: a short key; again, so the context is reused re-keyed */
  const char *m2 = "what do ya want for nothing?";
  for (int i = 0; i < 2; i++) {
    CHECK_EQ(crypto_hmac(CRYPTO_SHA256, "Jefe", 4, m2, strlen(m2), out), 32);
    CHECK_HEX(out, 32,
              "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  }
  /* test case 6: a key longer than the block */
  uint8_t k6[131];
  memset(k6, 0xaa, sizeof(k6));
  const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  CHECK_EQ(crypto_hmac(CRYPTO_SHA256, k6, sizeof(k6), m6, strlen(m6), out), 32);
  CHECK_HEX(out, 32,
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  /* RFC 2202 HMAC-SHA1 test case 2, and an empty key */
  CHECK_EQ(crypto_hmac(CRYPTO_SHA1, "Jefe", 4, m2, strlen(m2), out), 20);
  CHECK_HEX(out, 20, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
  CHECK_EQ(crypto_hmac(CRYPTO_SHA256, "", 0, "", 0, out), 32);
  CHECK_HEX(out, 32,
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  CHECK_EQ(crypto_hmac(CRYPTO_NALG, "k", 1, "m", 1, out), -EINVAL);
}

static void test_kdf(void) {
  uint8_t out[64];
  /* RFC 6070 */
  CHECK_EQ(crypto_pbkdf2(CRYPTO_SHA1, "password", 8, "salt", 4, 1, out, 20), 0);
  CHECK_HEX(out, 20, "0c60c80f961f0e71f3a9b524af6012062fe037a6");
  CHECK_EQ(crypto_pbkdf2(CRYPTO_SHA1, "password", 8, "salt", 4, 4096, out, 20),
           0);
  CHECK_HEX(out, 20, "4b007901b765489abead49d926f721d065a429c1");
  CHECK_EQ(crypto_pbkdf2(CRYPTO_SHA1, "pass\0word", 9, "sa\0lt", 5, 4096, out,
                         16),
           0);
  CHECK_HEX(out, 16, "56fa6aa75548099dcc37d7f03425e0c3");
  CHECK_EQ(crypto_pbkdf2(CRYPTO_SHA1, "p", 1, "s", 1, 0, out, 20), -EINVAL);
  CHECK_EQ(crypto_pbkdf2(CRYPTO_SHA1, "p", 1, "s", 1, 1, out, 0), -EINVAL);
  /* RFC 7914 s12 */
  CHECK_EQ(crypto_scrypt("", 0, "", 0, 16, 1, 1, out, 64), 0);
  CHECK_HEX(out, 64,
            "77d6576238657b203b19ca42c18a0497f16b4844e3074ae8dfdffa3fede21442"
            "fcd0069ded0948f8326a753a0fc81f17e8d3e0fb2e0d3628cf35e20c38d18906");
  CHECK_EQ(crypto_scrypt("password", 8, "NaCl", 4, 1024, 8, 16, out, 64), 0);
  CHECK_HEX(out, 64,
            "fdbabe1c9d3472007856e7190d01e9fe7c6ad7cbc8237830e77376634b373162"
            "2eaf30d92e22a3886ff109279d9830dac727afb94a83ee6d8360cbdfa2cc0640");
  CHECK_EQ(crypto_scrypt("p", 1, "s", 1, 15, 1, 1, out, 16), -EINVAL);
  CHECK_EQ(crypto_scrypt("p", 1, "s", 1, 1, 1, 1, out, 16), -EINVAL);
  CHECK_EQ(crypto_scrypt("p", 1, "s", 1, 16, 0, 1, out, 16), -EINVAL);
  /* 128 * 2^24 * 8 = 16 GiB: over the limit, refused before any work */
  CHECK_EQ(crypto_scrypt("p", 1, "s", 1, 1u << 24, 8, 1, out, 16), -EINVAL);
  CHECK_EQ(crypto_scrypt("p", 1, "s", 1, 16, 1, 0xffffffffu, out, 16),
           -EINVAL);
}

static void test_random_equal(void) {
  uint8_t a[64] = {0}, b[64] = {0};
  CHECK_EQ(crypto_random(a, sizeof(a)), 0);
  CHECK_EQ(crypto_random(b, sizeof(b)), 0);
  CHECK(memcmp(a, b, sizeof(a)) != 0);
  CHECK_EQ(crypto_random(a, 0), 0);
  static uint8_t big[1 << 20];
  CHECK_EQ(crypto_random(big, sizeof(big)), 0);
  int zeros = 0;
  for (size_t i = 0; i < sizeof(big); i++) zeros += big[i] == 0;
  /* 4096 expected; 6 sigma either side */
  CHECK(zeros > 3700 && zeros < 4500);
  CHECK_EQ(crypto_equal("abc", "abc", 3), 1);
  CHECK_EQ(crypto_equal("abc", "abd", 3), 0);
  CHECK_EQ(crypto_equal("xbc", "abc", 3), 0);
  CHECK_EQ(crypto_equal("", "", 0), 1);
}

static int unhex(uint8_t *out, const char *s) {
  return (int)crypto_hex_decode(out, s, strlen(s));
}

static void test_gcm(void) {
  uint8_t key[32] = {0}, iv[12] = {0}, out[128], back[128];
  /* GCM spec test case 13: empty plaintext */
  CHECK_EQ(crypto_gcm_seal(key, iv, NULL, 0, "", 0, out), 0);
  CHECK_HEX(out, 16, "530f8afbc74536b9a963b4f1c4cb738b");
  CHECK_EQ(crypto_gcm_open(key, iv, NULL, 0, out, 0, back), 0);
  /* test case 14: one zero block */
  uint8_t zero[16] = {0};
  CHECK_EQ(crypto_gcm_seal(key, iv, NULL, 0, zero, 16, out), 0);
  CHECK_HEX(out, 32,
            "cea7403d4d606b6e074ec5d3baf39d18d0d1c8a799996bf0265b98b5d48ab919");
  /* test case 16: a key, an iv, aad and 60 bytes */
  uint8_t k16[32], iv16[12], pt[64], aad[20];
  CHECK_EQ(unhex(k16, "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"), 32);
  CHECK_EQ(unhex(iv16, "cafebabefacedbaddecaf888"), 12);
  CHECK_EQ(unhex(pt, "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
                     "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"), 60);
  CHECK_EQ(unhex(aad, "feedfacedeadbeeffeedfacedeadbeefabaddad2"), 20);
  CHECK_EQ(crypto_gcm_seal(k16, iv16, aad, 20, pt, 60, out), 0);
  CHECK_HEX(out, 76,
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
            "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
            "76fc6ece0f4e1768cddf8853bb2d551b");
  CHECK_EQ(crypto_gcm_open(k16, iv16, aad, 20, out, 60, back), 0);
  CHECK(memcmp(back, pt, 60) == 0);
  /* a flipped bit anywhere, other aad, or another key: refused */
  out[5] ^= 1;
  CHECK_EQ(crypto_gcm_open(k16, iv16, aad, 20, out, 60, back), -EBADMSG);
  out[5] ^= 1;
  out[70] ^= 0x80;
  CHECK_EQ(crypto_gcm_open(k16, iv16, aad, 20, out, 60, back), -EBADMSG);
  out[70] ^= 0x80;
  CHECK_EQ(crypto_gcm_open(k16, iv16, aad, 19, out, 60, back), -EBADMSG);
  CHECK_EQ(crypto_gcm_open(key, iv16, aad, 20, out, 60, back), -EBADMSG);
  CHECK_EQ(crypto_gcm_open(k16, iv16, aad, 20, out, 60, back), 0);
}

/* Encodes s, compares, decodes back; s and the encoding on guarded
 * pages so a read past either end faults. */
static void b64_case(const char *s, int flags, const char *want) {
  char enc[256];
  uint8_t dec[256];
  size_t n = strlen(s);
  size_t len = crypto_base64_encode(enc, check_guard(s), n, flags);
  CHECK_EQ(len, crypto_base64_len(n, flags));
  enc[len] = 0;
  CHECK(strcmp(enc, want) == 0);
  long d = crypto_base64_decode(dec, check_guard(enc), len, flags);
  CHECK_EQ(d, (long)n);
  CHECK(d == (long)n && memcmp(dec, s, n) == 0);
}

static long b64_dec(const char *s, int flags) {
  uint8_t dec[256];
  return crypto_base64_decode(dec, check_guard(s), strlen(s), flags);
}

static void test_encodings(void) {
  /* RFC 4648 s10 */
  const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  const char *pad[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=",
                       "Zm9vYmFy"};
  const char *nopad[] = {"", "Zg", "Zm8", "Zm9v", "Zm9vYg", "Zm9vYmE",
                         "Zm9vYmFy"};
  for (int i = 0; i < 7; i++) {
    b64_case(in[i], 0, pad[i]);
    b64_case(in[i], CRYPTO_B64_URL | CRYPTO_B64_NOPAD, nopad[i]);
    CHECK_EQ(b64_dec(nopad[i], 0), (long)strlen(in[i])); /* padding optional */
  }
  b64_case("\xfb\xff\xbf", 0, "+/+/");
  b64_case("\xfb\xff\xbf", CRYPTO_B64_URL, "-_-_");
  CHECK_EQ(b64_dec("-_-_", 0), -EBADMSG);
  CHECK_EQ(b64_dec("+/+/", CRYPTO_B64_URL), -EBADMSG);
  CHECK_EQ(b64_dec("Zg=", 0), -EBADMSG);    /* half a pad */
  CHECK_EQ(b64_dec("Z===", 0), -EBADMSG);
  CHECK_EQ(b64_dec("====", 0), -EBADMSG);
  CHECK_EQ(b64_dec("Zg==Zg==", 0), -EBADMSG); /* pad in the middle */
  CHECK_EQ(b64_dec("Zm9v\n", 0), -EBADMSG);
  CHECK_EQ(b64_dec("Zm9 v", 0), -EBADMSG);
  CHECK_EQ(b64_dec("Z", 0), -EBADMSG);
  CHECK_EQ(b64_dec("Zm9vY", 0), -EBADMSG);
  CHECK_EQ(b64_dec("Zm\x80v", 0), -EBADMSG);

  char h[16];
  uint8_t b[8];
  CHECK_EQ(crypto_hex_encode(h, "\x00\x9f\xff", 3), 6);
  CHECK(memcmp(h, "009fff", 6) == 0);
  CHECK_EQ(crypto_hex_decode(b, check_guard("009FfF"), 6), 3);
  CHECK(memcmp(b, "\x00\x9f\xff", 3) == 0);
  CHECK_EQ(crypto_hex_decode(b, check_guard("abc"), 3), -EBADMSG);
  CHECK_EQ(crypto_hex_decode(b, check_guard("0g"), 2), -EBADMSG);
  CHECK_EQ(crypto_hex_decode(b, check_guard(""), 0), 0);
}

/* Each thread hashes, MACs and seals with its own contexts; every
 * result is checked (TSan sees the first-use fetch race if there is one). */
static void *worker(void *arg) {
  long bad = 0;
  uint8_t out[64], key[32] = {1}, iv[12] = {2}, ct[64], pt[48];
  for (int i = 0; i < 2000; i++) {
    if (crypto_sha256("abc", 3, out) != 32 || out[0] != 0xba) bad++;
    if (crypto_hmac(CRYPTO_SHA1, "Jefe", 4, "what do ya want for nothing?", 28,
                    out) != 20 ||
        out[0] != 0xef)
      bad++;
    if (crypto_gcm_seal(key, iv, NULL, 0, "0123456789abcdef", 16, ct) ||
        crypto_gcm_open(key, iv, NULL, 0, ct, 16, pt) ||
        memcmp(pt, "0123456789abcdef", 16))
      bad++;
  }
  return (void *)bad;
}

static void test_threads(void) {
  pthread_t t[4];
  for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, worker, NULL) == 0);
  for (int i = 0; i < 4; i++) {
    void *bad;
    pthread_join(t[i], &bad);
    CHECK_EQ((long)bad, 0);
  }
}

/* PEM text of a fresh key (private, or its public half), in buf. */
static size_t pem_of(EVP_PKEY *k, int priv, char *buf, size_t cap) {
  BIO *b = BIO_new(BIO_s_mem());
  int ok = priv ? PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL)
                : PEM_write_bio_PUBKEY(b, k);
  char *p;
  long n = ok ? BIO_get_mem_data(b, &p) : 0;
  if (n <= 0 || (size_t)n > cap) abort();
  memcpy(buf, p, (size_t)n);
  BIO_free(b);
  return (size_t)n;
}

/* Sign with the private PEM, verify with the public PEM; a changed
 * message or signature byte fails; a public key cannot sign. */
static void pkey_case(EVP_PKEY *gen, int type) {
  static char pem[8192];
  size_t n = pem_of(gen, 1, pem, sizeof(pem));
  crypto_pkey_t *priv = crypto_pkey_from_pem(pem, n);
  CHECK(priv != NULL);
  n = pem_of(gen, 0, pem, sizeof(pem));
  crypto_pkey_t *pub = crypto_pkey_from_pem(pem, n);
  CHECK(pub != NULL);
  if (!priv || !pub) return;
  CHECK_EQ(crypto_pkey_type(priv), type);
  CHECK_EQ(crypto_pkey_type(pub), type);
  CHECK_EQ(crypto_pkey_private(priv), 1);
  CHECK_EQ(crypto_pkey_private(pub), 0);
  uint8_t sig[1024];
  size_t slen = sizeof(sig);
  CHECK_EQ(crypto_pkey_sign(priv, "header.payload", 14, sig, &slen), 0);
  if (type != CRYPTO_PKEY_RSA) CHECK_EQ(slen, 64);
  CHECK_EQ(crypto_pkey_verify(pub, "header.payload", 14, sig, slen), 1);
  CHECK_EQ(crypto_pkey_verify(priv, "header.payload", 14, sig, slen), 1);
  CHECK_EQ(crypto_pkey_verify(pub, "header.paylo4d", 14, sig, slen), 0);
  sig[slen / 2] ^= 1;
  CHECK_EQ(crypto_pkey_verify(pub, "header.payload", 14, sig, slen), 0);
  CHECK_EQ(crypto_pkey_verify(pub, "header.payload", 14, sig, slen - 1), 0);
  size_t small = sizeof(sig);
  CHECK_EQ(crypto_pkey_sign(pub, "x", 1, sig, &small), -EINVAL);
  crypto_pkey_free(priv);
  crypto_pkey_free(pub);
}

static void test_pkey(void) {
  EVP_PKEY *rsa = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
  EVP_PKEY *ec = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
  EVP_PKEY *ed = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
  EVP_PKEY *small = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
  EVP_PKEY *p384 = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-384");
  CHECK(rsa && ec && ed && small && p384);
  pkey_case(rsa, CRYPTO_PKEY_RSA);
  pkey_case(ec, CRYPTO_PKEY_EC_P256);
  pkey_case(ed, CRYPTO_PKEY_ED25519);
  /* keys JWT's algorithms here don't take: refused with EINVAL */
  static char pem[8192];
  size_t n = pem_of(small, 0, pem, sizeof(pem));
  errno = 0;
  CHECK(crypto_pkey_from_pem(pem, n) == NULL && errno == EINVAL);
  n = pem_of(p384, 0, pem, sizeof(pem));
  errno = 0;
  CHECK(crypto_pkey_from_pem(pem, n) == NULL && errno == EINVAL);
  errno = 0;
  const char *junk = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
  CHECK(crypto_pkey_from_pem(junk, strlen(junk)) == NULL && errno == EBADMSG);
  CHECK(crypto_pkey_from_pem("", 0) == NULL);
  /* JWK members: the EC point must be on the curve */
  uint8_t x[32] = {1}, y[32] = {2};
  errno = 0;
  CHECK(crypto_pkey_from_jwk(CRYPTO_PKEY_EC_P256, x, 32, y, 32) == NULL && errno == EINVAL);
  CHECK(crypto_pkey_from_jwk(CRYPTO_PKEY_EC_P256, x, 31, y, 32) == NULL);
  crypto_pkey_t *k = crypto_pkey_from_jwk(CRYPTO_PKEY_ED25519, x, 32, NULL, 0);
  CHECK(k == NULL || crypto_pkey_type(k) == CRYPTO_PKEY_ED25519);
  crypto_pkey_free(k);
  uint8_t nbytes[256], e[3] = {1, 0, 1};
  memset(nbytes, 0xc3, sizeof(nbytes));
  k = crypto_pkey_from_jwk(CRYPTO_PKEY_RSA, nbytes, sizeof(nbytes), e, 3);
  CHECK(k != NULL && crypto_pkey_type(k) == CRYPTO_PKEY_RSA);
  crypto_pkey_free(k);
  CHECK(crypto_pkey_from_jwk(CRYPTO_PKEY_RSA, nbytes, 128, e, 3) == NULL); /* 1024 bits */
  crypto_pkey_free(NULL);
  EVP_PKEY_free(rsa);
  EVP_PKEY_free(ec);
  EVP_PKEY_free(ed);
  EVP_PKEY_free(small);
  EVP_PKEY_free(p384);
}

int main(void) {
  test_threads(); /* first, so the threads race for the first fetch */
  CHECK_EQ(crypto_init(), 0);
  test_hashes();
  test_hmac();
  test_kdf();
  test_random_equal();
  test_gcm();
  test_encodings();
  test_pkey();
  return check_summary();
}
