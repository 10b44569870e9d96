/* SPDX-License-Identifier: MIT */

/* LD_PRELOAD shim for wrk in scripts/bench-tls: makes every TLS connection
 * wrk opens a full handshake, and counts what the handshakes were.
 *
 * Why: wrk reconnects a connection with SSL_clear() on the same SSL object,
 * and SSL_clear keeps the session of a cleanly closed connection, so the
 * next SSL_connect offers it and the server resumes (TLS 1.3 PSK): with
 * `Connection: close` plain wrk measures resumed handshakes, not new ones.
 * Dropping the session after SSL_clear makes each reconnect a full
 * handshake (ECDHE + the server's certificate and signature).
 *
 * Environment:
 *   WRK_TLS_FRESH=1      drop the session on reconnect (else only count)
 *   WRK_TLS_SUITES=LIST  the TLS 1.3 cipher suites to offer (SSL_set_ciphersuites)
 *   WRK_TLS_REPORT=FILE  at exit, append one line to FILE:
 *     "tls_handshakes full=N resumed=N version=TLSv1.3 cipher=NAME group=NAME"
 *     (the version, cipher and key-exchange group of the last handshake)
 * Built by the script at run time: cc -shared -fPIC -o X.so this.c -lssl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/ssl.h>
#include <openssl/objects.h>

static long n_full, n_resumed;

/* WRK_TLS_SUITES: the only TLS 1.3 cipher suites wrk offers, so every
 * server negotiates the same one whatever its own preference order */
SSL *SSL_new(SSL_CTX *ctx)
{
	static SSL *(*real)(SSL_CTX *);
	if (!real)
		real = (SSL *(*)(SSL_CTX *))dlsym(RTLD_NEXT, "SSL_new");
	SSL *s = real(ctx);
	const char *suites = getenv("WRK_TLS_SUITES");
	if (s && suites && *suites && SSL_set_ciphersuites(s, suites) != 1) {
		fprintf(stderr, "wrk_tls_fresh: bad WRK_TLS_SUITES '%s'\n", suites);
		SSL_free(s);
		return NULL;
	}
	return s;
}
static char last_version[32], last_cipher[64], last_group[32];

int SSL_clear(SSL *s)
{
	static int (*real)(SSL *);
	if (!real)
		real = (int (*)(SSL *))dlsym(RTLD_NEXT, "SSL_clear");
	int r = real(s);
	const char *fresh = getenv("WRK_TLS_FRESH");
	if (r == 1 && fresh && strcmp(fresh, "1") == 0)
		SSL_set_session(s, NULL);
	return r;
}

int SSL_connect(SSL *s)
{
	static int (*real)(SSL *);
	if (!real)
		real = (int (*)(SSL *))dlsym(RTLD_NEXT, "SSL_connect");
	int r = real(s);
	if (r == 1) {
		if (SSL_session_reused(s))
			__atomic_fetch_add(&n_resumed, 1, __ATOMIC_RELAXED);
		else
			__atomic_fetch_add(&n_full, 1, __ATOMIC_RELAXED);
		/* racy between wrk threads, but only for a label */
		snprintf(last_version, sizeof last_version, "%s", SSL_get_version(s));
		snprintf(last_cipher, sizeof last_cipher, "%s", SSL_get_cipher_name(s));
		int nid = SSL_get_negotiated_group(s);
		const char *g = nid ? OBJ_nid2sn(nid) : NULL;
		snprintf(last_group, sizeof last_group, "%s", g ? g : "?");
	}
	return r;
}

__attribute__((destructor)) static void report(void)
{
	const char *path = getenv("WRK_TLS_REPORT");
	if (!path || !*path)
		return;
	FILE *f = fopen(path, "a");
	if (!f)
		return;
	fprintf(f, "tls_handshakes full=%ld resumed=%ld version=%s cipher=%s group=%s\n",
		n_full, n_resumed, last_version[0] ? last_version : "?",
		last_cipher[0] ? last_cipher : "?", last_group[0] ? last_group : "?");
	fclose(f);
}
