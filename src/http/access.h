/* SPDX-License-Identifier: MIT */

/* access: the access-log line of one HTTP request (--log), in the
 * combined format with the seconds the request took:
 *   ip - - [day/Mon/year:hh:mm:ss +0000] "GET /t HTTP/1.1" 200 5 "ref" "ua" 0.001
 * Quotes, backslashes, control bytes and bytes past ASCII are written as
 * \xHH, and each field has a bound (a longer one is cut and ends with
 * "..."), so a line always fits and a client can't forge one. Pure: no
 * I/O, no allocation, any thread. The server (http/server.c) writes it. */
#ifndef MP_HTTP_ACCESS_H
#define MP_HTTP_ACCESS_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "http/http1.h"

/* The buffer a line needs at most (its '\n' included). */
#define HTTP_ACCESS_LINE_MAX 4096

/* Writes the line, ending with '\n', to buf (HTTP_ACCESS_LINE_MAX bytes)
 * and returns its length. `req`: the parsed request; NULL for one refused
 * before its head was parsed: then raw[0..rawlen) is its request line (if
 * it came whole; rawlen 0 logs "-"). */
size_t http_access_line(char *buf, const char *ip, time_t when,
                        const http_request_t *req, const char *raw,
                        size_t rawlen, int status, uint64_t bytes,
                        double seconds);

#endif
