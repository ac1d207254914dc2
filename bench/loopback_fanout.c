/*
 * loopback_fanout — the kernel's floor for bench/control_propagation: N (1000) TCP connections on
 * 127.0.0.1, a 300-byte write to each from 1 or 2 sender threads, one epoll loop reading them on the
 * same machine (as the control bench's client does). Prints the time until all N were received,
 * for 20 rounds. No sluice involved: whatever sluice's fan-out takes beyond this is its own cost.
 * bench/fanout_floor.c is the closer floor (control_propagation's own client, sluice's fan-out code,
 * fresh connections each round) and runs beside every control_propagation.sh run; this one stays
 * for the earlier figures in bench/RESULTS-control.md.
 *
 *   cc -O2 -o /tmp/loopback_fanout bench/loopback_fanout.c -lpthread && /tmp/loopback_fanout 2
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define N 1000
#define ROUNDS 20

static int srv[N], cli[N];
static char msg[300];

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef struct {
    int lo, hi;
} range_t;

static void *sender(void *arg)
{
    range_t *r = arg;
    for (int i = r->lo; i < r->hi; i++)
        send(srv[i], msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
    return NULL;
}

static void watch_all(int ep)
{
    for (int i = 0; i < N; i++) {
        struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, cli[i], &e);
    }
}

int main(int argc, char **argv)
{
    int nthreads = argc > 1 ? atoi(argv[1]) : 2;
    if (nthreads < 1 || nthreads > 8)
        nthreads = 2;
    memset(msg, 'x', sizeof(msg));
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 2048) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) != 0) {
        perror("listen");
        return 1;
    }
    for (int i = 0; i < N; i++) {
        int one = 1;
        cli[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (cli[i] < 0 || connect(cli[i], (struct sockaddr *)&a, sizeof(a)) != 0 ||
            (srv[i] = accept(l, NULL, NULL)) < 0) {
            perror("connect");
            return 1;
        }
        setsockopt(srv[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    int ep = epoll_create1(0);
    watch_all(ep);
    for (int round = 0; round < ROUNDS; round++) {
        pthread_t th[8];
        range_t rg[8];
        double t0 = now_ms();
        for (int k = 0; k < nthreads; k++) {
            rg[k] = (range_t){k * N / nthreads, (k + 1) * N / nthreads};
            pthread_create(&th[k], NULL, sender, &rg[k]);
        }
        int got = 0;
        char buf[4096];
        struct epoll_event ev[256];
        while (got < N) {
            int n = epoll_wait(ep, ev, 256, 1000);
            for (int j = 0; j < n; j++) {
                int fd = cli[ev[j].data.u32];
                if (recv(fd, buf, sizeof(buf), 0) > 0)
                    got++;
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
            }
        }
        printf("%.2f ", now_ms() - t0);
        for (int k = 0; k < nthreads; k++)
            pthread_join(th[k], NULL);
        watch_all(ep);
    }
    printf("\n");
    return 0;
}
