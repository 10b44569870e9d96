/* SPDX-License-Identifier: MIT */

/* tls: the TLS record layer of a connection, over OpenSSL 3, as a
 * transport the reactor puts under a connection (net/reactor.h,
 * conn_opts_t.tls). It never touches a socket: the reactor feeds it the
 * bytes it read and gets plaintext back, and hands it plaintext to send,
 * which comes out as records through the connection's `out` function. So
 * the reactor keeps every system call (and the io_uring batching), and
 * nothing above the reactor knows a connection is encrypted except by
 * asking (reactor_conn_tls). This and net/tls.c are the only files that
 * include OpenSSL.
 *
 * Contexts (net_tls_ctx_t) are made once (a server's certificates, or a
 * client's trust settings) and shared by every connection and thread that
 * uses them; a connection (net_tls_t) belongs to its reactor's thread. */
#ifndef MP_TLS_H
#define MP_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct net_tls_ctx net_tls_ctx_t;
typedef struct net_tls net_tls_t;

/* The process-wide start: OpenSSL's, and the ticket ratchet the
 * session-ticket keys come from (tls.c says what a worker's memory still
 * yields). Call once in the first process before it forks (the root), so
 * every worker forked from it derives the same ticket keys and a session
 * resumes on any of them. Returns 0 or a negative errno. Idempotent. */
int net_tls_global_init(void);

/* A fresh random ticket secret for the workers forked from now on (the
 * root, at a reload): tickets issued before it no longer resume there.
 * 0 or a negative errno. Any thread. */
int net_tls_reseed(void);

/* ---- contexts ---- */

/* One certificate of a server: PEM files. `chain` may be NULL (the chain
 * may also follow the certificate in `cert`). `names` lists the host
 * names (a leading "*." matches one label) SNI selects it by; the first
 * certificate of a server is its default, served to clients that send no
 * name or one no certificate lists. */
typedef struct {
  const char *cert, *key, *chain;
  const char *const *names;
  size_t nnames;
} net_tls_cert_t;

/* A server context over `n` certificates: TLS 1.2 and 1.3 only, forward-
 * secret AEAD ciphers, ALPN "http/1.1" when `alpn_http`, stateless session
 * tickets whose keys rotate every NET_TLS_TICKET_PERIOD seconds (a ticket
 * is taken for two periods). NULL on failure with one line naming the
 * file and the reason in err. Any thread. */
net_tls_ctx_t *net_tls_server_ctx(const net_tls_cert_t *certs, size_t n,
                                  bool alpn_http, char *err, size_t errlen);
/* The same, offering the protocols of `alpn` by ALPN (the wire format:
 * each name after its length byte, our preference first; NULL: no ALPN),
 * which must outlive the context. */
net_tls_ctx_t *net_tls_server_ctx_alpn(const net_tls_cert_t *certs, size_t n,
                                       const char *alpn, char *err,
                                       size_t errlen);

#define NET_TLS_TICKET_PERIOD 3600

/* A client context: verify (default) checks the peer's chain against `ca`
 * (a PEM file) or, when NULL, the system's store, and the host name given
 * to net_tls_new; cert/key (both or neither) are a client certificate.
 * `alpn` (NULL for none) is a protocol to offer, such as "http/1.1". NULL
 * on failure with the reason in err. Any thread. */
typedef struct {
  bool verify;
  const char *ca, *cert, *key, *alpn;
} net_tls_client_opts_t;
net_tls_ctx_t *net_tls_client_ctx(const net_tls_client_opts_t *o, char *err,
                                  size_t errlen);

/* The shared client context that verifies against the system store (made
 * on first use, never freed before exit). NULL (and err) on failure. */
net_tls_ctx_t *net_tls_client_default(char *err, size_t errlen);

/* Contexts are counted: every connection holds one reference. Any
 * thread. */
void net_tls_ctx_ref(net_tls_ctx_t *ctx);
void net_tls_ctx_unref(net_tls_ctx_t *ctx);
bool net_tls_ctx_is_server(const net_tls_ctx_t *ctx);

/* ---- a connection's record layer (its reactor's thread) ---- */

/* Where records go: the reactor writes them to the socket or queues them.
 * Returns 0 or a negative errno (the connection is then failing). */
typedef int (*net_tls_out_fn)(void *arg, const void *data, size_t len);

/* A connection's TLS over ctx (which it references). For a client, `host`
 * is the name sent as SNI and verified against the certificate (an IP
 * address is verified as one and not sent as SNI); NULL skips both. NULL
 * on failure (no memory). */
net_tls_t *net_tls_new(net_tls_ctx_t *ctx, const char *host,
                       net_tls_out_fn out, void *arg);
void net_tls_free(net_tls_t *t);

/* Hands over bytes read from the socket. They are borrowed until the next
 * net_tls_read that returns NET_TLS_WANT, or net_tls_stash: call that
 * before `data` goes away with bytes unread. */
void net_tls_feed(net_tls_t *t, const char *data, size_t len);
/* Copies the fed bytes not read yet, so the caller's buffer may go. 0 or
 * -ENOMEM. */
int net_tls_stash(net_tls_t *t);
/* Whether bytes wait in it (fed or stashed records, or decrypted
 * plaintext not read yet): net_tls_read has something to do. */
bool net_tls_has_input(const net_tls_t *t);

enum {
  NET_TLS_WANT = 0,     /* nothing more without more bytes from the socket */
  NET_TLS_OPENED = -1,  /* the handshake completed just now */
  NET_TLS_EOF = -2,     /* the peer's close_notify: a clean end */
  NET_TLS_FAIL = -3,    /* a protocol or verification error: net_tls_error */
  NET_TLS_PLAIN = -4,   /* a server got plaintext where a ClientHello goes */
};

/* Runs the handshake and decrypts: > 0 plaintext bytes in buf (at most
 * cap), or one of the values above. NET_TLS_OPENED comes once, before any
 * plaintext. */
ssize_t net_tls_read(net_tls_t *t, char *buf, size_t cap);

/* Whether the handshake is done (plaintext can be written). */
bool net_tls_open(const net_tls_t *t);

/* Encrypts `len` bytes (open only) into records through `out`. 0 or
 * NET_TLS_FAIL. */
int net_tls_write(net_tls_t *t, const void *data, size_t len);
/* Sends close_notify once (open only). */
void net_tls_close_notify(net_tls_t *t);

/* Whether it failed (a NET_TLS_FAIL or NET_TLS_PLAIN came). */
bool net_tls_has_failed(const net_tls_t *t);
/* Why it failed (after NET_TLS_FAIL), as one line: "certificate verify
 * failed: hostname mismatch", "no shared cipher", ... */
const char *net_tls_error(const net_tls_t *t);

typedef struct {
  const char *protocol; /* "TLSv1.3" */
  const char *cipher;   /* "TLS_AES_128_GCM_SHA256" */
  const char *sni;      /* the name the client asked for, or NULL */
  char alpn[32];        /* the protocol agreed on, or "" */
  bool resumed;         /* a resumed session (no full handshake) */
  bool server;
} net_tls_info_t;
/* About an open connection; the strings live as long as `t`. */
void net_tls_info(const net_tls_t *t, net_tls_info_t *info);

/* kTLS: whether the kernel offers the `tls` upper-layer protocol
 * (/proc/sys/net/ipv4/tcp_available_ulp), read once. Without it a static
 * file goes through OpenSSL (read, encrypt, write) instead of sendfile. */
bool net_tls_kernel_available(void);

#endif
