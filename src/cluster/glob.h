/* SPDX-License-Identifier: MIT */

/* glob: channel patterns for pub/sub, with the meaning Redis gives them
 * (so a pattern means the same locally and through the Redis engine). */
#ifndef MP_GLOB_H
#define MP_GLOB_H

#include <stdbool.h>
#include <stddef.h>

/* The longest pattern lx_pubsub accepts at subscribe. Up to this length
 * (in fact up to 255 elements: bytes, `?`s, classes) glob_match runs in
 * time linear in len(str), whatever the pattern; past it, it falls back
 * to O(len(pat) * len(str)). */
#define GLOB_MAX_PATTERN 256

/* Whether `str` matches `pat`. Both are byte strings with lengths (binary
 * safe). In a pattern: `*` matches any run of bytes (also none), `?` any
 * one byte, `[abc]` one of a set, `[^abc]` one byte not in it, `[a-z]` a
 * range (either order), and `\x` the byte x itself (also inside brackets).
 * An unclosed `[` runs to the end of the pattern. Pure; any thread. */
bool glob_match(const char *pat, size_t plen, const char *str, size_t slen);

/* Whether `pat` has any special byte (`*`, `?`, `[`, `\`): a pattern
 * without one matches only itself. */
bool glob_is_pattern(const char *pat, size_t plen);

#endif
