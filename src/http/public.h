/* SPDX-License-Identifier: MIT */

/* public: the one static-file sender of the server (mp.http's `public`
 * folder, with or without on_request). It answers GET and HEAD from the
 * folder as nginx's `try_files $uri @app` does: a path that names a
 * regular file under it (or a folder's index.html) is answered here, in C;
 * any other request, and a path that names nothing, goes on to the
 * application, or is answered 404 when there is none. Files are opened
 * with openat2(RESOLVE_BENEATH) from the folder's fd, so neither a "..",
 * an absolute path nor a symlink can lead outside it (a symlink that
 * stays inside is followed); the lexical checks of http_static_path come
 * first, so a climbing request never reaches the file system. Validators
 * (ETag, Last-Modified, If-None-Match, If-Modified-Since), one Range
 * (with If-Range) and a precompressed .gz sibling are honoured.
 * Reactor thread, like server.h. */
#ifndef MP_HTTP_PUBLIC_H
#define MP_HTTP_PUBLIC_H

#include <stdbool.h>

#include "http/server.h"

/* Opens the folder `dir` for http_server_t.public_fd and checks that
 * openat2 works here (Linux 5.6; a container's seccomp profile may refuse
 * it). The fd, or a negative errno with *step "open" or "openat2". */
int http_public_open(const char *dir, const char **step);

/* Answers exchange x from its server's public_fd if it names a file
 * there (true: answered, the response complete or the connection
 * refused), or leaves it (false). `app`: an application takes what is
 * left; without one every request is answered here (404, 405). Meant
 * for http_server_t.on_before. */
bool http_public_answer(http_exchange_t *x, bool app);

#endif
