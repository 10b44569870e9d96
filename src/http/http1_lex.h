/* SPDX-License-Identifier: MIT */

/* http1_lex: the lexical pieces the request parser (http1.c) and the
 * response parser (http1_response.c) share. Internal to src/http: not a
 * public contract. Pure functions of their arguments; any thread. */
#ifndef MP_HTTP1_LEX_H
#define MP_HTTP1_LEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* tchar (RFC 9110 5.6.2): 1 for the characters of methods and field
 * names. */
extern const unsigned char http__tchar[256];
/* a[0..alen) equals the NUL-terminated b, ASCII case-insensitively. */
bool http__ieq(const char *a, size_t alen, const char *b);
/* Content-Length digits as a number; -1 if malformed or 19 digits and
 * more. */
int64_t http__length(const char *v, size_t n);

#endif
