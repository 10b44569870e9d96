/* SPDX-License-Identifier: MIT */

/* notify: tells a service manager (systemd, Type=notify) how the server
 * is doing, through the datagram socket named by $NOTIFY_SOCKET. */
#ifndef MP_NOTIFY_H
#define MP_NOTIFY_H

/* Takes $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace)
 * and removes it from the environment, so processes a script starts and
 * the workers don't talk to the manager in the server's name. Call once
 * at start, on the main thread, before any other thread exists. Returns
 * 0, or -EINVAL for an unusable address (then notify_send does nothing). */
int notify_init(void);

/* Sends `state` ("READY=1", "RELOADING=1\nMONOTONIC_USEC=...", ...) as one
 * datagram; does nothing without a socket. 0 or a negative errno. The
 * process that called notify_init only (forked workers have none). Any
 * thread. */
int notify_send(const char *state);

/* notify_send of "RELOADING=1" with the MONOTONIC_USEC that systemd 253
 * and later want with it. */
int notify_reloading(void);

#endif
