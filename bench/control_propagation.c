/*
 * control_propagation — how long a flow-control change takes to reach parked readers.
 *
 *   control_propagation HOST PORT [POLLS=1000] [ROUNDS=20] [SLUICE_PID]
 *
 * Opens POLLS long-polls (GET /api/v1/control/jobs/bench?version=V&wait=120s) and one SSE
 * subscriber, waits until sluice reports them all parked, then takes t0 and sends
 * POST /api/v1/control/jobs/bench/pause (or /resume, alternating). For every poll the time from
 * t0 to the first byte of its answer is recorded, and the same for the SSE event and for the
 * POST's own answer. One epoll loop, no threads, so the client adds microseconds, not
 * milliseconds — when it runs: on a loaded 2-core machine the client itself waits for a CPU
 * (sluice's fan-out wakes it on the sending core), so each poll's answer is also timed by the
 * kernel's receive timestamp (SO_TIMESTAMPNS: when the answer's first segment reached the poll's
 * socket, whenever the client reads it). Both are printed. Repeats ROUNDS times and prints p50/p99/max over all answers, and, given the
 * daemon's pid, its RSS growth per parked poll. Connections and parked polls sluice already had
 * (another load running) are counted as a baseline, so it can run against a busy daemon.
 *
 * Not part of the build: compile with
 *   cc -O2 -o /tmp/control_propagation bench/control_propagation.c
 * (bench/control_propagation.sh does that and starts a release build of sluice for you.)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "stamped_read.h"

static struct sockaddr_in addr;

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        perror("connect");
        exit(1);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void send_all(int fd, const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w <= 0) {
            perror("write");
            exit(1);
        }
        s += w;
        n -= (size_t)w;
    }
}

/* Simple blocking request on a fresh connection; returns the body (static buffer). */
static char *get(const char *path)
{
    static char buf[1 << 20];
    int fd = dial();
    char req[512];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n", path);
    send_all(fd, req);
    size_t n = 0;
    ssize_t r;
    while ((r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = 0;
    close(fd);
    char *body = strstr(buf, "\r\n\r\n");
    return body ? body + 4 : buf;
}

static double metric(const char *name)
{
    char *m = get("/-/metrics"); /* sluice's own metrics, without the pushed groups */
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    char *p = strstr(m, key);
    return p ? atof(p + strlen(key)) : -1;
}

static long rss_kb(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = atol(line + 6);
    if (f)
        fclose(f);
    return kb;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s HOST PORT [POLLS] [ROUNDS] [SLUICE_PID]\n", argv[0]);
        return 2;
    }
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[2]));
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    int npolls = argc > 3 ? atoi(argv[3]) : 1000;
    int rounds = argc > 4 ? atoi(argv[4]) : 20;
    int pid = argc > 5 ? atoi(argv[5]) : 0;

    double *lat = malloc(sizeof(double) * (size_t)npolls * (size_t)rounds);
    double *arr = malloc(sizeof(double) * (size_t)npolls * (size_t)rounds); /* by receive timestamp */
    int narr = 0;
    double *sse_lat = malloc(sizeof(double) * (size_t)rounds);
    double *post_lat = malloc(sizeof(double) * (size_t)rounds);
    double *all_lat = malloc(sizeof(double) * (size_t)rounds); /* time until the last poll answered */
    double *spread = malloc(sizeof(double) * (size_t)rounds);  /* first answer -> last poll answered */
    int *fds = malloc(sizeof(int) * (size_t)npolls);
    int nlat = 0;
    int ep = epoll_create1(0);

    /* current version of the job */
    char *st = get("/api/v1/control/jobs/bench");
    char *vp = strstr(st, "\"version\":");
    long version = vp ? atol(vp + 10) : 0;

    int sse = dial();
    send_all(sse, "GET /api/v1/control/stream?job=bench HTTP/1.1\r\nHost: b\r\n\r\n");
    char junk[65536];
    struct epoll_event e = {.events = EPOLLIN, .data.fd = sse};
    epoll_ctl(ep, EPOLL_CTL_ADD, sse, &e);
    usleep(100 * 1000);
    while (recv(sse, junk, sizeof(junk), MSG_DONTWAIT) > 0) /* headers and the hello comment */
        ;

    /* Under other load (bench/control_propagation.sh with SOAK=1) sluice already holds connections
     * and parked polls of its own: count ours on top of what was there before the first round. */
    double base_conns = metric("sluice_http_open_connections");
    /* sluice's own split of a change's time (its histograms), as means over this run's changes */
    static const char *const phases[] = {"sluice_control_commit_duration_seconds",
                                         "sluice_control_fanout_duration_seconds",
                                         "sluice_control_propagation_seconds"};
    double phase_sum0[3], phase_n0[3];
    char key[128];
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof(key), "%s_sum", phases[i]);
        phase_sum0[i] = metric(key);
        snprintf(key, sizeof(key), "%s_count", phases[i]);
        phase_n0[i] = metric(key);
    }
    long rss_before = 0, rss_parked = 0;
    for (int r = 0; r < rounds; r++) {
        /* sluice counts a closed connection as open until its sweep; let the last round's 1,000
         * go before opening 1,000 more, or --web.max-connections would refuse some */
        double settle = now_ms() + 10000; /* other clients' connections come and go: not forever */
        while (metric("sluice_http_open_connections") > base_conns + 50 && now_ms() < settle)
            usleep(50 * 1000);
        double base_parked = metric("sluice_control_long_polls_parked");
        if (r == 0 && pid)
            rss_before = rss_kb(pid);
        char req[256];
        snprintf(req, sizeof(req), "GET /api/v1/control/jobs/bench?version=%ld&wait=120s HTTP/1.1\r\nHost: b\r\n\r\n",
                 version);
        for (int i = 0; i < npolls; i++) {
            fds[i] = dial();
            int on = 1;
            setsockopt(fds[i], SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on));
            send_all(fds[i], req);
            /* one-shot: no epoll_ctl/close in the timed loop, so the client stays cheap */
            struct epoll_event pe = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = fds[i]};
            epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &pe);
        }
        double deadline = now_ms() + 60000;
        while (metric("sluice_control_long_polls_parked") < base_parked + npolls) {
            if (now_ms() > deadline) {
                fprintf(stderr, "round %d: only %.0f of %d polls parked\n", r,
                        metric("sluice_control_long_polls_parked"), npolls);
                ssize_t k = recv(fds[0], junk, sizeof(junk) - 1, MSG_DONTWAIT);
                if (k > 0) {
                    junk[k] = 0;
                    fprintf(stderr, "a poll's answer: %s\n", junk);
                }
                return 1;
            }
            usleep(2000);
        }
        if (r == 0 && pid)
            rss_parked = rss_kb(pid);

        int post = dial();
        const char *action = (r % 2 == 0) ? "pause" : "resume";
        char preq[256];
        snprintf(
            preq, sizeof(preq),
            "POST /api/v1/control/jobs/bench/%s HTTP/1.1\r\nHost: b\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            action);
        struct epoll_event pe = {.events = EPOLLIN, .data.fd = post};
        epoll_ctl(ep, EPOLL_CTL_ADD, post, &pe);
        double t0 = now_ms(), t0_real = real_ms();
        send_all(post, preq);
        int polls_left = npolls;
        int sse_done = 0, post_done = 0;
        double last = 0, first = -1, rx_first = -1, rx_last = -1;
        struct epoll_event evs[256];
        while (polls_left > 0 || !sse_done || !post_done) {
            int n = epoll_wait(ep, evs, 256, 30000);
            if (n <= 0) {
                fprintf(stderr, "timed out with %d poll answers missing\n", polls_left);
                return 1;
            }
            double t = now_ms() - t0;
            if (first < 0)
                first = t;
            for (int k = 0; k < n; k++) {
                int fd = evs[k].data.fd;
                double rx = read_stamped(fd, junk, sizeof(junk));
                if (fd == sse) {
                    /* an event may arrive in several reads; the first byte is what counts */
                    if (!sse_done)
                        sse_lat[r] = t;
                    sse_done = 1;
                } else if (fd == post) {
                    post_lat[r] = t;
                    post_done = 1;
                    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                    close(fd);
                } else {
                    lat[nlat++] = t;
                    if (rx >= 0) {
                        arr[narr++] = rx - t0_real;
                        if (rx_first < 0 || rx - t0_real < rx_first)
                            rx_first = rx - t0_real;
                        if (rx - t0_real > rx_last)
                            rx_last = rx - t0_real;
                    }
                    last = t;
                    polls_left--;
                }
            }
        }
        for (int i = 0; i < npolls; i++) {
            epoll_ctl(ep, EPOLL_CTL_DEL, fds[i], NULL);
            close(fds[i]);
        }
        /* drain the rest of the SSE event before the next round */
        usleep(2000);
        while (recv(sse, junk, sizeof(junk), MSG_DONTWAIT) > 0)
            ;
        all_lat[r] = last;
        spread[r] = last - first;
        if (getenv("CP_ROUNDS"))
            printf("  round %2d: first answer arrived %6.2f ms, last %6.2f ms, last read %6.2f ms, POST answered %6.2f ms\n",
                   r, rx_first, rx_last, last, post_lat[r]);
        st = get("/api/v1/control/jobs/bench");
        vp = strstr(st, "\"version\":");
        version = vp ? atol(vp + 10) : version + 1;
    }
    qsort(lat, (size_t)nlat, sizeof(double), cmp);
    qsort(sse_lat, (size_t)rounds, sizeof(double), cmp);
    qsort(post_lat, (size_t)rounds, sizeof(double), cmp);
    qsort(all_lat, (size_t)rounds, sizeof(double), cmp);
    qsort(spread, (size_t)rounds, sizeof(double), cmp);
    printf("control change -> %d parked long-polls, %d rounds (%d answers)\n", npolls, rounds, nlat);
    printf("  long-poll answer   p50 %7.2f ms   p99 %7.2f ms   max %7.2f ms\n", pct(lat, nlat, 0.5),
           pct(lat, nlat, 0.99), lat[nlat - 1]);
    if (narr > 0) {
        qsort(arr, (size_t)narr, sizeof(double), cmp);
        printf("  answer arrived     p50 %7.2f ms   p99 %7.2f ms   max %7.2f ms   (kernel receive time, %d answers)\n",
               pct(arr, narr, 0.5), pct(arr, narr, 0.99), arr[narr - 1], narr);
    }
    printf("  all %d answered    p50 %7.2f ms   p99 %7.2f ms   (per round)\n", npolls, pct(all_lat, rounds, 0.5),
           pct(all_lat, rounds, 0.99));
    printf("  fan-out (first answer -> all %d answered) p50 %6.2f ms   p99 %6.2f ms\n", npolls,
           pct(spread, rounds, 0.5), pct(spread, rounds, 0.99));
    printf("  SSE event          p50 %7.2f ms   p99 %7.2f ms\n", pct(sse_lat, rounds, 0.5), pct(sse_lat, rounds, 0.99));
    printf("  POST acknowledged  p50 %7.2f ms   p99 %7.2f ms   (includes the fsync'd commit)\n",
           pct(post_lat, rounds, 0.5), pct(post_lat, rounds, 0.99));
    if (phase_n0[0] >= 0) { /* a sluice with the histograms */
        double mean[3];
        for (int i = 0; i < 3; i++) {
            snprintf(key, sizeof(key), "%s_sum", phases[i]);
            double ds = metric(key) - phase_sum0[i];
            snprintf(key, sizeof(key), "%s_count", phases[i]);
            double dn = metric(key) - phase_n0[i];
            mean[i] = dn > 0 ? ds / dn * 1e3 : -1;
        }
        printf("  inside sluice (means): commit %.2f ms, fan-out %.2f ms, queued change -> polls answered %.2f ms\n",
               mean[0], mean[1], mean[2]);
    }
    printf("  TIS polling every 10 s: mean delay 5000 ms, worst 10000 ms\n");
    if (pid && rss_before > 0)
        printf("  memory per parked poll: %.1f KiB (RSS %ld -> %ld KiB with %d parked)\n",
               (double)(rss_parked - rss_before) / npolls, rss_before, rss_parked, npolls);
    return 0;
}
