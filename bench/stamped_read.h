/*
 * stamped_read.h — the clocks and the timestamped read that bench/control_propagation.c and
 * bench/fanout_floor.c share, so both time an answer the same way: when the client read it and
 * when the kernel received it (SO_TIMESTAMPNS). Header-only: each bench is one standalone file.
 */
#ifndef SLUICE_BENCH_STAMPED_READ_H
#define SLUICE_BENCH_STAMPED_READ_H

#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline double real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Reads what fd has; returns the kernel's receive time of it (CLOCK_REALTIME ms, SO_TIMESTAMPNS),
 * or -1 when the socket gave none. */
static inline double read_stamped(int fd, char *buf, size_t len)
{
    union {
        char b[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {buf, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    if (recvmsg(fd, &mh, 0) <= 0)
        return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof(ts));
            return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
        }
    return -1;
}

#endif
