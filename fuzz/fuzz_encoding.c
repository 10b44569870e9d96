/* SPDX-License-Identifier: MIT */

/* libFuzzer target: crypto.c's base64 (both alphabets, padded or not) and
 * hex decoders. Any input either fails with -EBADMSG or decodes to at
 * most its stated bound, and what it decodes to encodes back to a string
 * that decodes to the same bytes (the decoders accept no two spellings
 * of different bytes). The input is copied to a buffer of exactly its
 * size, so ASan sees a read past the end. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/crypto.h"
#include "fuzz_check.h"

static void b64(const char *in, size_t n, int flags) {
  size_t cap = n / 4 * 3 + 2;
  uint8_t *out = malloc(cap + 1);
  long d = crypto_base64_decode(out, in, n, flags);
  FUZZ_CHECK(d == -EBADMSG || (d >= 0 && (size_t)d <= cap));
  if (d >= 0) {
    size_t elen = crypto_base64_len((size_t)d, flags);
    char *enc = malloc(elen + 1);
    FUZZ_CHECK(crypto_base64_encode(enc, out, (size_t)d, flags) == elen);
    uint8_t *back = malloc((size_t)d + 3);
    FUZZ_CHECK(crypto_base64_decode(back, enc, elen, flags) == d);
    FUZZ_CHECK(memcmp(back, out, (size_t)d) == 0);
    free(back);
    free(enc);
  }
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *in = malloc(size ? size : 1);
  memcpy(in, data, size);
  b64(in, size, 0);
  b64(in, size, CRYPTO_B64_URL);
  b64(in, size, CRYPTO_B64_URL | CRYPTO_B64_NOPAD);
  uint8_t *out = malloc(size / 2 + 1);
  long d = crypto_hex_decode(out, in, size);
  FUZZ_CHECK(d == -EBADMSG || (size % 2 == 0 && d == (long)(size / 2)));
  if (d > 0) {
    char *enc = malloc(size);
    crypto_hex_encode(enc, out, (size_t)d);
    for (size_t i = 0; i < size; i++)
      FUZZ_CHECK(enc[i] == (in[i] >= 'A' && in[i] <= 'F' ? in[i] + 32 : in[i]));
    free(enc);
  }
  free(out);
  free(in);
  return 0;
}
