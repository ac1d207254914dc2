/*
 * fanout — one buffer written to many sockets with as few system calls as possible.
 *
 * api/control answers 1,000 parked long-polls with the same bytes the moment a change is
 * durable. One send() per socket costs a system call each, and on a virtual machine the entry and
 * exit are a large part of a small loopback send (see bench/RESULTS-control.md); an io_uring
 * submission carries up to FANOUT_DEPTH sends in one call, each executed inline by the kernel
 * during the submit. Every send is non-blocking (MSG_DONTWAIT | MSG_NOSIGNAL): a full socket
 * buffer reports -EAGAIN, never waits, and a closed peer reports -EPIPE, never raises SIGPIPE.
 *
 * When io_uring is not available (an old kernel, a seccomp filter, io_uring_disabled) or fails,
 * the same contract is kept with a loop of send(): callers see only the results.
 *
 * A fanout_t is used by one thread at a time.
 */
#ifndef SLUICE_NET_FANOUT_H
#define SLUICE_NET_FANOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define FANOUT_DEPTH 512 /* sends per submission */

typedef struct fanout fanout_t;

/* Sends run on `lanes` threads at once: the caller's and lanes - 1 helpers, each with its own
 * ring (without use_ring, with send(): the fallback, for tests). Never fails for lack of io_uring
 * (then it sends with send()) or of helper threads (then with fewer lanes); NULL only when out
 * of memory. */
fanout_t *fanout_new(int lanes, bool use_ring);
void fanout_free(fanout_t *fo);

/* Whether the caller's sends go through io_uring (for logs and tests). */
bool fanout_batched(const fanout_t *fo);

/* Writes buf[0..len) to each of fds[0..n), non-blocking; res[i] is what send(fds[i]) would have
 * returned: the bytes written (possibly fewer than len) or -errno. */
void fanout_send(fanout_t *fo, const int *fds, size_t n, const void *buf, size_t len, ssize_t *res);

#endif
