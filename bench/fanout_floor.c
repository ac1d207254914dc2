/*
 * fanout_floor — the floor under bench/control_propagation: the same client, the same fan-out
 * code, nothing else of sluice.
 *
 *   fanout_floor [POLLS=1000] [ROUNDS=20] [LANES=2] [ANSWER_BYTES=420]
 *
 * control_propagation times a flow-control change from the POST to each of 1,000 parked
 * long-polls having its answer, with its client on the same two CPUs as sluice. This program
 * keeps that client's shape (a fresh connection per poll that sent its request first, one
 * epoll loop with one-shot registrations, each answer timed when read and by its kernel receive
 * timestamp) and answers the polls the way sluice does, with internal/net/fanout (io_uring lanes,
 * the helper kept off the caller's CPU) from a thread that a pipe wakes, as the POST's worker
 * wakes sluice's control thread. What it leaves out is what sluice adds: HTTP parsing, the fsync'd
 * commit of the change and finding the parked polls. Whatever control_propagation measures
 * beyond this program's figures, in the same minutes, is sluice's own.
 *
 * bench/control_propagation.sh builds it against the release core library and runs it before
 * sluice's figures (FLOOR=0 skips it); by hand:
 *   cc -O2 -I. -Ibuild/gen -o /tmp/fanout_floor bench/fanout_floor.c build/libsluice_core.a -luring -lpthread
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "internal/net/fanout.h"
#include "stamped_read.h"

/* The answering side: waits for a byte on the pipe, then sends the answer to every poll's server
 * socket through the fan-out, as sluice's control thread does after a commit. */
typedef struct {
    int wake_fd;
    fanout_t *fo;
    int *fds;
    size_t n;
    char *answer;
    size_t len;
    ssize_t *res;
} floor_server_t;

static void *floor_server_main(void *arg)
{
    floor_server_t *s = arg;
    char c;
    while (read(s->wake_fd, &c, 1) == 1 && c == 'g')
        fanout_send(s->fo, s->fds, s->n, s->answer, s->len, s->res);
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    return v[(int)(p * (n - 1) + 0.5)];
}

int main(int argc, char **argv)
{
    int npolls = argc > 1 ? atoi(argv[1]) : 1000;
    int rounds = argc > 2 ? atoi(argv[2]) : 20;
    int lanes = argc > 3 ? atoi(argv[3]) : 2;
    size_t alen = argc > 4 ? (size_t)atoi(argv[4]) : 420; /* headers + one job's state, as sluice answers */
    if (npolls < 1 || rounds < 1 || lanes < 1 || alen < 1) {
        fprintf(stderr, "usage: %s [POLLS] [ROUNDS] [LANES] [ANSWER_BYTES]\n", argv[0]);
        return 2;
    }
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 4096) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) != 0) {
        perror("listen");
        return 1;
    }
    int pipefd[2];
    if (pipe(pipefd) != 0) {
        perror("pipe");
        return 1;
    }
    floor_server_t s = {.wake_fd = pipefd[0], .fo = fanout_new(lanes, true), .n = (size_t)npolls, .len = alen};
    s.fds = calloc((size_t)npolls, sizeof(int));
    s.res = calloc((size_t)npolls, sizeof(ssize_t));
    s.answer = malloc(alen);
    int *cli = calloc((size_t)npolls, sizeof(int));
    double *lat = malloc(sizeof(double) * (size_t)npolls * (size_t)rounds);
    double *arr = malloc(sizeof(double) * (size_t)npolls * (size_t)rounds);
    double *last_read = malloc(sizeof(double) * (size_t)rounds);
    if (!s.fo || !s.fds || !s.res || !s.answer || !cli || !lat || !arr || !last_read) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(s.answer, 'x', alen);
    printf("fan-out floor: %d polls, %d rounds, %d lanes (%s), %zu-byte answer\n", npolls, rounds, lanes,
           fanout_batched(s.fo) ? "io_uring" : "send()", alen);
    pthread_t th;
    pthread_create(&th, NULL, floor_server_main, &s);
    int ep = epoll_create1(0);
    static const char req[] = "GET /api/v1/control/jobs/bench?version=1&wait=120s HTTP/1.1\r\nHost: b\r\n\r\n";
    char junk[65536];
    int nlat = 0, narr = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < npolls; i++) {
            int one = 1;
            cli[i] = socket(AF_INET, SOCK_STREAM, 0);
            if (cli[i] < 0 || connect(cli[i], (struct sockaddr *)&a, sizeof(a)) != 0) {
                perror("connect");
                return 1;
            }
            setsockopt(cli[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            setsockopt(cli[i], SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
            if (write(cli[i], req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
                perror("write");
                return 1;
            }
            struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = cli[i]};
            epoll_ctl(ep, EPOLL_CTL_ADD, cli[i], &e);
        }
        for (int i = 0; i < npolls; i++) {
            int one = 1;
            s.fds[i] = accept(l, NULL, NULL);
            if (s.fds[i] < 0 || read(s.fds[i], junk, sizeof(junk)) <= 0) {
                perror("accept");
                return 1;
            }
            setsockopt(s.fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        usleep(200 * 1000); /* parked: past the server's delayed ACK of the request */
        double t0 = now_ms(), t0_real = real_ms();
        if (write(pipefd[1], "g", 1) != 1) {
            perror("pipe write");
            return 1;
        }
        int left = npolls;
        double last = 0;
        struct epoll_event evs[256];
        while (left > 0) {
            int n = epoll_wait(ep, evs, 256, 30000);
            if (n <= 0) {
                fprintf(stderr, "timed out with %d answers missing\n", left);
                return 1;
            }
            double t = now_ms() - t0;
            for (int k = 0; k < n; k++) {
                double rx = read_stamped(evs[k].data.fd, junk, sizeof(junk));
                lat[nlat++] = t;
                if (rx >= 0)
                    arr[narr++] = rx - t0_real;
                last = t;
                left--;
            }
        }
        last_read[r] = last;
        for (int i = 0; i < npolls; i++) {
            epoll_ctl(ep, EPOLL_CTL_DEL, cli[i], NULL);
            close(cli[i]);
            close(s.fds[i]);
        }
        usleep(50 * 1000);
    }
    qsort(lat, (size_t)nlat, sizeof(double), cmp);
    qsort(arr, (size_t)narr, sizeof(double), cmp);
    qsort(last_read, (size_t)rounds, sizeof(double), cmp);
    printf("  answer read        p50 %7.2f ms   p99 %7.2f ms   max %7.2f ms\n", pct(lat, nlat, 0.5),
           pct(lat, nlat, 0.99), lat[nlat - 1]);
    if (narr > 0)
        printf("  answer arrived     p50 %7.2f ms   p99 %7.2f ms   max %7.2f ms   (kernel receive time)\n",
               pct(arr, narr, 0.5), pct(arr, narr, 0.99), arr[narr - 1]);
    printf("  all %d read        p50 %7.2f ms   p99 %7.2f ms   (per round)\n", npolls, pct(last_read, rounds, 0.5),
           pct(last_read, rounds, 0.99));
    if (write(pipefd[1], "q", 1) == 1)
        pthread_join(th, NULL);
    fanout_free(s.fo);
    free(s.fds);
    free(s.res);
    free(s.answer);
    free(cli);
    free(lat);
    free(arr);
    free(last_read);
    close(ep);
    close(l);
    close(pipefd[0]);
    close(pipefd[1]);
    return 0;
}
