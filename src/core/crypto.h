/* SPDX-License-Identifier: MIT */

/* crypto: hashes, HMAC, password hashing (PBKDF2, scrypt), random bytes,
 * constant-time comparison, AES-256-GCM and the text encodings (base64,
 * base64url, hex) over libcrypto (OpenSSL 3), for the core (the WebSocket
 * handshake's SHA-1) and the Lua binding (mp.crypto, whose
 * lua/moonport/crypto.lua calls these through LuaJIT's FFI: the functions
 * are exported from the binary, the names are the contract).
 *
 * Threads: every function may be called from any thread at once. The
 * algorithms are fetched from OpenSSL once per process (the first call);
 * the contexts a one-shot call reuses (digest, HMAC, cipher) are the
 * calling thread's own and freed when the thread ends.
 *
 * Errors: 0 or a count on success, a negative errno on failure: -EINVAL
 * for an unknown algorithm or parameters out of range, -EBADMSG for bad
 * encoded input or a ciphertext whose tag does not verify, -EIO when
 * libcrypto fails (its error queue is cleared), -ENOMEM. Output buffers
 * are the caller's; each function says how large. No function keeps a
 * pointer it was given. */
#ifndef MP_CORE_CRYPTO_H
#define MP_CORE_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

/* Digest algorithms, by their lower-case names: "md5", "sha1", "sha224",
 * "sha256", "sha384", "sha512". */
enum {
  CRYPTO_MD5,
  CRYPTO_SHA1,
  CRYPTO_SHA224,
  CRYPTO_SHA256,
  CRYPTO_SHA384,
  CRYPTO_SHA512,
  CRYPTO_NALG
};
#define CRYPTO_MAX_DIGEST 64 /* bytes: SHA-512's */

/* The algorithm named `name` (len bytes, not NUL-terminated), or -EINVAL. */
int crypto_alg(const char *name, size_t len);

/* The digest length of alg in bytes, or -EINVAL. */
int crypto_digest_len(int alg);

/* Fetches every algorithm from libcrypto now (the other functions do it
 * on first use): 0, or -EIO if one is missing (a FIPS-only provider has
 * no MD5, say; the functions using it then fail with -EIO). */
int crypto_init(void);

/* ---- hashes ---- */

/* The digest of p[0..n) into out (crypto_digest_len(alg) bytes). Returns
 * that length or a negative errno. */
int crypto_hash(int alg, const void *p, size_t n, uint8_t *out);

/* Shorthands: crypto_hash with out of the algorithm's length. */
int crypto_sha1(const void *p, size_t n, uint8_t out[20]);
int crypto_sha256(const void *p, size_t n, uint8_t out[32]);

/* A digest fed in pieces. crypto_hash_new returns a new one, or NULL with
 * errno (EINVAL, ENOMEM, EIO). crypto_hash_final writes the digest to out
 * and returns its length; after it, update and final fail with -EINVAL
 * until crypto_hash_reset. One thread at a time per object. */
typedef struct crypto_hash crypto_hash_t;
crypto_hash_t *crypto_hash_new(int alg);
int crypto_hash_update(crypto_hash_t *h, const void *p, size_t n);
int crypto_hash_final(crypto_hash_t *h, uint8_t *out);
int crypto_hash_reset(crypto_hash_t *h);
void crypto_hash_free(crypto_hash_t *h); /* NULL is fine */

/* ---- MACs and key derivation ---- */

/* HMAC (RFC 2104) of msg under key into out (crypto_digest_len(alg)
 * bytes). Returns that length or a negative errno. */
int crypto_hmac(int alg, const void *key, size_t klen, const void *msg,
                size_t mlen, uint8_t *out);

/* PBKDF2-HMAC (RFC 8018) with alg: outlen bytes (1 to 1 MiB) into out;
 * iterations 1 to 100,000,000. 0 or a negative errno. */
int crypto_pbkdf2(int alg, const void *pass, size_t plen, const void *salt,
                  size_t slen, uint32_t iterations, uint8_t *out,
                  size_t outlen);

/* scrypt (RFC 7914): N a power of two >= 2, r and p >= 1, the memory it
 * takes (128 * N * r bytes plus a little) at most CRYPTO_SCRYPT_MAXMEM;
 * outlen 1 to 1 MiB. 0 or a negative errno (-EINVAL past the limits). */
#define CRYPTO_SCRYPT_MAXMEM (1024u * 1024 * 1024)
int crypto_scrypt(const void *pass, size_t plen, const void *salt,
                  size_t slen, uint64_t N, uint32_t r, uint32_t p,
                  uint8_t *out, size_t outlen);

/* ---- random bytes and comparison ---- */

/* n bytes from the kernel's CSPRNG (getrandom(2), which blocks only
 * until the pool is first initialised at boot). 0 or a negative errno. */
int crypto_random(void *out, size_t n);

/* 1 if a[0..n) equals b[0..n), else 0, in time that depends on n only. */
int crypto_equal(const void *a, const void *b, size_t n);

/* A uuid (RFC 9562) as text, 36 characters (no NUL) into out: version 4
 * (random) or 7 (the Unix time in ms, then random bits: they sort by
 * creation time). 0 or a negative errno (-EINVAL: another version). */
int crypto_uuid(int version, char out[36]);

/* ---- AES-256-GCM ---- */

#define CRYPTO_GCM_KEY 32
#define CRYPTO_GCM_IV 12
#define CRYPTO_GCM_TAG 16

/* Encrypts pt[0..n) under key and iv (never reuse an iv with a key) with
 * aad authenticated too: writes n bytes of ciphertext and then the
 * 16-byte tag to out (n + 16 bytes). 0 or a negative errno. */
int crypto_gcm_seal(const uint8_t key[CRYPTO_GCM_KEY],
                    const uint8_t iv[CRYPTO_GCM_IV], const void *aad,
                    size_t aadlen, const void *pt, size_t n, uint8_t *out);

/* The inverse: ct is n bytes of ciphertext followed by the tag (n + 16
 * in all); writes n bytes of plaintext to out. -EBADMSG when the tag
 * does not verify (out then holds nothing the caller may use). */
int crypto_gcm_open(const uint8_t key[CRYPTO_GCM_KEY],
                    const uint8_t iv[CRYPTO_GCM_IV], const void *aad,
                    size_t aadlen, const uint8_t *ct, size_t n, uint8_t *out);

/* ---- public-key signatures (JWT's RS256, ES256, EdDSA; crypto_pkey.c) ---- */

/* A public or private key: RSA, EC P-256 or Ed25519. */
typedef struct crypto_pkey crypto_pkey_t;
enum { CRYPTO_PKEY_RSA = 1, CRYPTO_PKEY_EC_P256, CRYPTO_PKEY_ED25519 };

/* A key from PEM text (a PUBLIC KEY, an X.509 CERTIFICATE's key, or an
 * unencrypted PRIVATE KEY / RSA PRIVATE KEY / EC PRIVATE KEY), or NULL
 * with errno (EBADMSG: not one of those; EINVAL: another key type, another
 * curve, or RSA outside 2048 to 8192 bits). */
crypto_pkey_t *crypto_pkey_from_pem(const char *pem, size_t len);

/* A public key from a JWK's members, each the raw big-endian bytes its
 * base64url value decodes to: RSA (a = n, b = e), EC P-256 (a = x,
 * b = y, 32 bytes each), Ed25519 (a = x, 32 bytes; b unused). NULL with
 * errno (EINVAL, EIO). */
crypto_pkey_t *crypto_pkey_from_jwk(int type, const uint8_t *a, size_t alen,
                                    const uint8_t *b, size_t blen);

/* CRYPTO_PKEY_*, and whether it holds a private key (1/0). */
int crypto_pkey_type(const crypto_pkey_t *k);
int crypto_pkey_private(const crypto_pkey_t *k);
void crypto_pkey_free(crypto_pkey_t *k); /* NULL is fine */

/* Signs msg: RSA with PKCS#1 v1.5 and SHA-256, EC with SHA-256 (the
 * signature as JWS's r || s, 64 bytes), Ed25519 (64 bytes). out holds
 * *outlen bytes (1024 is enough: RSA keys are 2048 to 8192 bits) and gets
 * *outlen set.
 * 0 or a negative errno (-EINVAL: a public key). */
int crypto_pkey_sign(crypto_pkey_t *k, const void *msg, size_t mlen,
                     uint8_t *out, size_t *outlen);

/* 1 if sig is k's signature of msg (the forms above), 0 if not, or a
 * negative errno. */
int crypto_pkey_verify(crypto_pkey_t *k, const void *msg, size_t mlen,
                       const uint8_t *sig, size_t slen);

/* ---- encodings ---- */

#define CRYPTO_B64_URL 1   /* the URL-safe alphabet (RFC 4648 s5) */
#define CRYPTO_B64_NOPAD 2 /* no trailing '=' */

/* The length crypto_base64_encode writes for n bytes. */
size_t crypto_base64_len(size_t n, int flags);

/* Writes base64 of in[0..n) to out (crypto_base64_len bytes, no NUL);
 * returns that length. */
size_t crypto_base64_encode(char *out, const void *in, size_t n, int flags);

/* Decodes in[0..n) (padding optional, but right if present; no
 * whitespace; the alphabet flags names, the other one refused) into out
 * (n / 4 * 3 + 2 bytes suffice). Returns the decoded length or -EBADMSG. */
long crypto_base64_decode(uint8_t *out, const char *in, size_t n, int flags);

/* Lower-case hex of in[0..n) into out (2n bytes); returns 2n. */
size_t crypto_hex_encode(char *out, const void *in, size_t n);

/* Hex (either case, even length) into out (n / 2 bytes); returns n / 2
 * or -EBADMSG. */
long crypto_hex_decode(uint8_t *out, const char *in, size_t n);

#endif
