/*
 * push_bench — Flink-shaped push load generator for sluice, the Pushgateway and VictoriaMetrics.
 *
 *   push_bench --target sluice|pushgateway|vm --port P [--host 127.0.0.1] [--tms 200]
 *              [--rounds 5] [--conns 8] [--seed 1] [--max-seconds 0] [--timeout 60]
 *              [--pid SERVER_PID] [--name LABEL] [--bodies FILE] [--interval SECONDS]
 *   push_bench --write-bodies FILE [--tms 200] [--rounds 5] [--seed 1]
 *
 * Load: TaskManager i (0..tms-1) pushes the body internal/expfmt/flinkgen.h makes for it
 * (~1,282 series, ~590 KiB, text 0.0.4 as Flink's reporter writes it), once per round, with
 * tick = round + 1 so counters grow. Push order is round-major (every TM of round 0, then every
 * TM of round 1, ...), so one group never has two pushes in flight with 8 connections and 200
 * TMs. Each push goes to its own group:
 *
 *   sluice, pushgateway   PUT  /metrics/job/flink-tm-<i>
 *   vm                    POST /api/v1/import/prometheus?extra_label=job=flink-tm-<i>
 *
 * All bodies (every round) are generated (or mapped from a file --write-bodies made, so repeated
 * runs skip the generation) before the clock starts, so generation costs nothing during the
 * measurement. The client is one thread with one epoll loop and `--conns` keep-alive
 * HTTP/1.1 connections, each with one request in flight (no pipelining); a push's latency is from
 * the first byte written to the last byte of its response read. `--max-seconds` stops issuing new
 * pushes after that long (in-flight ones finish, bounded by --timeout, after which the push
 * counts as a time-out): how the very slow Pushgateway-with-consistency-check run is capped.
 *
 * Fixed rate (--interval S): instead of flat out, TaskManager t pushes round r at
 * start + r*S + t*S/tms (the real cadence, phases spread evenly); a push's latency then counts
 * from when it was due, so a push that waited for a free connection is charged for the wait (no
 * coordinated omission). Use enough --conns that the client is not the bottleneck. The server's
 * CPU time over the run (utime + stime of --pid) is reported as cpu_s and per million samples.
 *
 * Output: human lines, then one machine-readable line for bench/push_bench.sh:
 *   RESULT name=.. pushes=.. ok=.. errors=.. timeouts=.. seconds=.. pushes_s=.. samples_s=..
 *          p50_ms=.. p99_ms=.. max_ms=.. rss_kb=.. hwm_kb=.. planned=.. series=..
 *          steady_samples_s=.. (rounds 2..N only: every series exists) first_round_s=..
 *          cpu_s=.. cpu_s_per_1m=.. steady_p50_ms=.. steady_p99_ms=.. (rounds 2..N)
 *          round1_p50_ms=.. round1_p99_ms=.. (round 1 only: every push creates its group's series)
 *          disk_mib=.. disk_mib_per_min=.. (what --pid wrote to storage over the run, or from the
 *          start of round --disk-from-round on; see proc_write_bytes. With --interval, a late
 *          round and minutes of rounds after it, the disk traffic of the steady state)
 * --latency-log FILE writes one line per push: round, TaskManager, start and end (seconds after
 * the clock started), latency (ms), HTTP status, connection index; and the clock's
 * CLOCK_MONOTONIC origin on a first "# t0_monotonic=" line, to line pushes up with a server
 * profile (perf -k CLOCK_MONOTONIC).
 * RSS / HWM are the server's VmRSS / VmHWM (/proc/<pid>/status) after the last push.
 *
 * Not part of the CMake build (bench/ is not globbed); bench/push_bench.sh compiles it with
 *   cc -O2 -I<repo> bench/push_bench.c internal/expfmt/flinkgen.c internal/util/buf.c -lm
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "internal/expfmt/flinkgen.h"

enum { T_SLUICE, T_PUSHGATEWAY, T_VM };

typedef struct {
    char *head; /* request line + headers */
    size_t headlen;
    const char *body;
    size_t bodylen;
    size_t series;
    int round;
} req_t;

typedef struct {
    int fd;
    bool busy;
    req_t *req;
    size_t sent; /* over head then body */
    double t0; /* when the push was due (fixed rate) or first written */
    char rbuf[8192];
    size_t rlen;
    size_t need;      /* total response bytes once headers are parsed, 0 = unknown yet */
    bool until_close; /* no length: read to EOF */
    bool chunked;
    int status;
} conn_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static struct sockaddr_in g_addr;
static int g_ep;

static int conn_open(conn_t *c)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&g_addr, sizeof(g_addr)) < 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.ptr = c};
    if (epoll_ctl(g_ep, EPOLL_CTL_ADD, fd, &ev) < 0)
        die("epoll_ctl");
    c->fd = fd;
    return 0;
}

static void conn_close(conn_t *c)
{
    if (c->fd >= 0) {
        epoll_ctl(g_ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
}

static void conn_events(conn_t *c, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(g_ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Parses the response headers in c->rbuf once complete: sets status, need / chunked /
 * until_close. Returns 1 when parsed, 0 when more bytes are needed. */
static int parse_head(conn_t *c)
{
    char *end = memmem(c->rbuf, c->rlen, "\r\n\r\n", 4);
    if (!end)
        return 0;
    size_t hl = (size_t)(end - c->rbuf) + 4;
    c->status = 0;
    if (c->rlen >= 12 && memcmp(c->rbuf, "HTTP/1.", 7) == 0)
        c->status = atoi(c->rbuf + 9);
    c->until_close = true;
    c->chunked = false;
    for (char *p = c->rbuf; p < end;) {
        char *nl = memmem(p, (size_t)(end - p) + 2, "\r\n", 2);
        if (!nl)
            break;
        if (nl - p > 15 && strncasecmp(p, "content-length:", 15) == 0) {
            c->need = hl + strtoul(p + 15, NULL, 10);
            c->until_close = false;
        } else if (nl - p > 18 && strncasecmp(p, "transfer-encoding:", 18) == 0 &&
                   memmem(p, (size_t)(nl - p), "chunked", 7)) {
            c->chunked = true;
            c->until_close = false;
        }
        p = nl + 2;
    }
    if (c->status == 204 || c->status == 304) {
        c->need = hl;
        c->until_close = false;
        c->chunked = false;
    }
    if (c->chunked)
        c->need = 0;
    else if (c->until_close)
        c->need = SIZE_MAX;
    return 1;
}

typedef struct {
    int target;
    const char *host, *name;
    int port, tms, rounds, conns, pid;
    uint64_t seed;
    double max_seconds, timeout, interval; /* interval: fixed-rate seconds between a TM's pushes, 0 = flat out */
    const char *bodies, *write_bodies, *latency_log;
    int disk_from; /* disk_mib_per_min from the start of this round (1-based) on; 0 or 1: the whole run */
} opts_t;

/* --bodies file: per body (round-major, as generated) u64 series, u64 length, the bytes; mapped
 * and read in place. Its TMS x ROUNDS must match the options. */
static void load_bodies(const opts_t *o, req_t *reqs, size_t nreq)
{
    int fd = open(o->bodies, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        die(o->bodies);
    off_t size = lseek(fd, 0, SEEK_END);
    const char *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED)
        die("mmap");
    close(fd);
    size_t off = 0;
    for (size_t k = 0; k < nreq; k++) {
        uint64_t hdr[2];
        if (off + sizeof(hdr) > (size_t)size) {
            fprintf(stderr, "push_bench: %s holds fewer than %zu bodies\n", o->bodies, nreq);
            exit(1);
        }
        memcpy(hdr, m + off, sizeof(hdr));
        off += sizeof(hdr);
        if (hdr[1] > (size_t)size - off) {
            fprintf(stderr, "push_bench: %s is truncated\n", o->bodies);
            exit(1);
        }
        reqs[k].series = (size_t)hdr[0];
        reqs[k].body = m + off;
        reqs[k].bodylen = (size_t)hdr[1];
        off += (size_t)hdr[1];
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static long proc_status_kb(int pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* utime + stime of pid in seconds, -1 when unknown. */
static double proc_cpu_s(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold blanks */
    unsigned long long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Bytes pid caused to be written to storage (write_bytes of /proc/<pid>/io: counted when a page
 * is dirtied, so a page rewritten before it reaches the disk counts once), -1 when unknown. */
static long long proc_write_bytes(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/io", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long long v = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "write_bytes: %lld", &v) == 1)
            break;
    fclose(f);
    return v;
}

static void usage(void)
{
    fprintf(stderr, "usage: push_bench --target sluice|pushgateway|vm --port P [--host H] [--tms N] "
                    "[--rounds R] [--conns C] [--seed S] [--max-seconds T] [--timeout T] [--pid PID] "
                    "[--name LABEL] [--bodies FILE] [--interval S] [--latency-log FILE]\n       push_bench --write-bodies FILE [--tms N] "
                    "[--rounds R] [--seed S]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    opts_t o = {.target = -1,
                .host = "127.0.0.1",
                .name = NULL,
                .port = 0,
                .tms = 200,
                .rounds = 5,
                .conns = 8,
                .pid = 0,
                .seed = 1,
                .max_seconds = 0,
                .timeout = 60,
                .interval = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--target"))
            o.target = !strcmp(v, "sluice")        ? T_SLUICE
                       : !strcmp(v, "pushgateway") ? T_PUSHGATEWAY
                       : !strcmp(v, "vm")          ? T_VM
                                                   : -2;
        else if (!strcmp(a, "--host"))
            o.host = v;
        else if (!strcmp(a, "--port"))
            o.port = atoi(v);
        else if (!strcmp(a, "--tms"))
            o.tms = atoi(v);
        else if (!strcmp(a, "--rounds"))
            o.rounds = atoi(v);
        else if (!strcmp(a, "--conns"))
            o.conns = atoi(v);
        else if (!strcmp(a, "--seed"))
            o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--max-seconds"))
            o.max_seconds = atof(v);
        else if (!strcmp(a, "--timeout"))
            o.timeout = atof(v);
        else if (!strcmp(a, "--pid"))
            o.pid = atoi(v);
        else if (!strcmp(a, "--name"))
            o.name = v;
        else if (!strcmp(a, "--bodies"))
            o.bodies = v;
        else if (!strcmp(a, "--write-bodies"))
            o.write_bodies = v;
        else if (!strcmp(a, "--interval"))
            o.interval = atof(v);
        else if (!strcmp(a, "--latency-log"))
            o.latency_log = v;
        else if (!strcmp(a, "--disk-from-round"))
            o.disk_from = atoi(v);
        else
            usage();
    }
    if (o.write_bodies && !o.bodies && o.target < 0)
        o.target = T_SLUICE, o.port = 1; /* only writing bodies: no server involved */
    if (o.target < 0 || o.port <= 0 || o.tms <= 0 || o.rounds <= 0 || o.conns <= 0)
        usage();
    if (!o.name)
        o.name = o.target == T_SLUICE ? "sluice" : o.target == T_PUSHGATEWAY ? "pushgateway" : "vm";

    memset(&g_addr, 0, sizeof(g_addr));
    g_addr.sin_family = AF_INET;
    g_addr.sin_port = htons((uint16_t)o.port);
    if (inet_pton(AF_INET, o.host, &g_addr.sin_addr) != 1)
        usage();

    /* ---- bodies: generated here, or read from a --bodies file made by --write-bodies */
    size_t nreq = (size_t)o.tms * (size_t)o.rounds;
    req_t *reqs = calloc(nreq, sizeof(*reqs));
    if (!reqs)
        die("calloc");
    size_t total_bytes = 0;
    double g0 = now_s();
    if (o.bodies) {
        load_bodies(&o, reqs, nreq);
    } else {
        FILE *out = NULL;
        if (o.write_bodies && !(out = fopen(o.write_bodies, "wb")))
            die(o.write_bodies);
        buf_t b;
        buf_init(&b);
        for (int r = 0; r < o.rounds; r++)
            for (int t = 0; t < o.tms; t++) {
                size_t k = (size_t)r * (size_t)o.tms + (size_t)t;
                buf_reset(&b);
                reqs[k].series = flinkgen_taskmanager(&b, (unsigned)t, o.seed, (uint64_t)r + 1);
                reqs[k].bodylen = b.len;
                if (out) {
                    uint64_t hdr[2] = {reqs[k].series, b.len};
                    if (fwrite(hdr, sizeof(hdr), 1, out) != 1 || fwrite(b.data, 1, b.len, out) != b.len)
                        die(o.write_bodies);
                } else {
                    char *copy = malloc(b.len);
                    if (!copy)
                        die("malloc");
                    memcpy(copy, b.data, b.len);
                    reqs[k].body = copy;
                }
            }
        buf_free(&b);
        if (out) {
            if (fclose(out) != 0)
                die(o.write_bodies);
            fprintf(stderr, "push_bench: wrote %zu bodies to %s\n", nreq, o.write_bodies);
            return 0;
        }
    }
    for (size_t k = 0; k < nreq; k++) {
        int t = (int)(k % (size_t)o.tms);
        reqs[k].round = (int)(k / (size_t)o.tms);
        total_bytes += reqs[k].bodylen;
        char head[512];
        int hl;
        if (o.target == T_VM)
            hl = snprintf(head, sizeof(head),
                          "POST /api/v1/import/prometheus?extra_label=job=flink-tm-%d HTTP/1.1\r\n"
                          "Host: %s:%d\r\nContent-Type: text/plain; version=0.0.4\r\n"
                          "Content-Length: %zu\r\n\r\n",
                          t, o.host, o.port, reqs[k].bodylen);
        else
            hl = snprintf(head, sizeof(head),
                          "PUT /metrics/job/flink-tm-%d HTTP/1.1\r\nHost: %s:%d\r\n"
                          "Content-Type: text/plain; version=0.0.4\r\nContent-Length: %zu\r\n\r\n",
                          t, o.host, o.port, reqs[k].bodylen);
        reqs[k].head = strdup(head);
        reqs[k].headlen = (size_t)hl;
    }
    fprintf(stderr, "push_bench: %zu bodies, %.1f MiB, ready in %.1f s\n", nreq, (double)total_bytes / 1048576,
            now_s() - g0);

    g_ep = epoll_create1(EPOLL_CLOEXEC);
    if (g_ep < 0)
        die("epoll_create1");
    conn_t *cs = calloc((size_t)o.conns, sizeof(*cs));
    for (int i = 0; i < o.conns; i++) {
        cs[i].fd = -1;
        if (conn_open(&cs[i]) < 0)
            die("connect");
        conn_events(&cs[i], EPOLLIN); /* nothing to send until a request is assigned */
    }

    double *lat = calloc(nreq, sizeof(double));
    size_t *round_left = calloc((size_t)o.rounds, sizeof(size_t));
    double *round_end = calloc((size_t)o.rounds, sizeof(double));
    for (int r = 0; r < o.rounds; r++)
        round_left[r] = (size_t)o.tms;
    unsigned char *tm_ok = calloc((size_t)o.tms, 1);
    size_t nlat = 0, next = 0, ok = 0, errors = 0, timeouts = 0, inflight = 0, ok_samples = 0;
    char first_err[512] = "";
    double *lat_steady = calloc(nreq, sizeof(double));
    double *lat_first = calloc(nreq, sizeof(double));
    size_t nsteady = 0, nfirst = 0;
    FILE *llog = NULL;
    if (o.latency_log && !(llog = fopen(o.latency_log, "w")))
        die(o.latency_log);
    double cpu0 = o.pid ? proc_cpu_s(o.pid) : -1;
    long long wb0 = o.pid ? proc_write_bytes(o.pid) : -1;
    double twb0 = -1; /* when wb0 was read, if not at the start */
    double t0 = now_s(), tend = t0;
    bool stop_issuing = false;
    if (llog)
        fprintf(llog, "# t0_monotonic=%.6f\n# round tm start_s end_s latency_ms status conn\n", t0);

    for (;;) {
        double t = now_s();
        if (o.max_seconds > 0 && t - t0 >= o.max_seconds)
            stop_issuing = true;
        /* hand out work to idle connections */
        double due = o.interval > 0 ? t0 + (double)(next / (size_t)o.tms) * o.interval +
                                          (double)(next % (size_t)o.tms) * o.interval / (double)o.tms
                                    : t;
        for (int i = 0; i < o.conns && !stop_issuing && next < nreq && due <= t; i++) {
            conn_t *c = &cs[i];
            if (c->busy)
                continue;
            if (c->fd < 0 && conn_open(c) < 0) {
                errors++;
                next++;
                continue;
            }
            c->busy = true;
            c->req = &reqs[next++];
            c->sent = 0;
            c->rlen = 0;
            c->need = 0;
            c->status = 0;
            c->t0 = o.interval > 0 ? due : now_s();
            inflight++;
            conn_events(c, EPOLLOUT | EPOLLIN);
            if (o.interval > 0 && next < nreq)
                due = t0 + (double)(next / (size_t)o.tms) * o.interval +
                      (double)(next % (size_t)o.tms) * o.interval / (double)o.tms;
        }
        if (inflight == 0 && (stop_issuing || next >= nreq))
            break;
        /* time-outs */
        for (int i = 0; i < o.conns; i++) {
            conn_t *c = &cs[i];
            if (c->busy && t - c->t0 > o.timeout) {
                timeouts++;
                conn_close(c);
                c->busy = false;
                inflight--;
            }
        }
        struct epoll_event evs[64];
        int wait_ms = 100;
        if (o.interval > 0 && next < nreq && due > t)
            wait_ms = (int)((due - t) * 1e3) + 1 < 100 ? (int)((due - t) * 1e3) + 1 : 100;
        int n = epoll_wait(g_ep, evs, 64, wait_ms);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int k = 0; k < n; k++) {
            conn_t *c = evs[k].data.ptr;
            if (c->fd < 0)
                continue;
            uint32_t e = evs[k].events;
            if (c->busy && (e & EPOLLOUT) && c->sent < c->req->headlen + c->req->bodylen) {
                for (;;) {
                    struct iovec iov[2];
                    int niov = 0;
                    req_t *rq = c->req;
                    if (c->sent < rq->headlen) {
                        iov[niov++] = (struct iovec){rq->head + c->sent, rq->headlen - c->sent};
                        iov[niov++] = (struct iovec){(void *)rq->body, rq->bodylen};
                    } else {
                        size_t off = c->sent - rq->headlen;
                        iov[niov++] = (struct iovec){(char *)rq->body + off, rq->bodylen - off};
                    }
                    ssize_t w = writev(c->fd, iov, niov);
                    if (w < 0) {
                        if (errno == EAGAIN)
                            break;
                        /* the server may close early (e.g. 4xx before the body); read what it said */
                        c->sent = rq->headlen + rq->bodylen;
                        break;
                    }
                    c->sent += (size_t)w;
                    if (c->sent >= rq->headlen + rq->bodylen)
                        break;
                }
                if (c->sent >= c->req->headlen + c->req->bodylen)
                    conn_events(c, EPOLLIN);
            }
            if (!(e & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                continue;
            bool eof = false;
            for (;;) {
                if (c->rlen == sizeof(c->rbuf)) { /* keep only the head; count the rest */
                    if (c->need && c->need != SIZE_MAX && c->need > c->rlen) {
                        size_t drop = c->rlen > 4096 ? c->rlen - 4096 : 0;
                        c->need -= drop;
                        c->rlen -= drop;
                    } else {
                        c->rlen = 4096;
                    }
                }
                ssize_t r = read(c->fd, c->rbuf + c->rlen, sizeof(c->rbuf) - c->rlen);
                if (r < 0) {
                    if (errno == EAGAIN)
                        break;
                    eof = true;
                    break;
                }
                if (r == 0) {
                    eof = true;
                    break;
                }
                c->rlen += (size_t)r;
            }
            if (!c->busy) { /* idle connection closed by the server (keep-alive time-out) */
                if (eof)
                    conn_close(c);
                continue;
            }
            bool done = false;
            if (c->need == 0 && !c->chunked && parse_head(c) == 0) {
                if (eof)
                    done = true; /* truncated */
            }
            if (!done) {
                if (c->chunked)
                    done = c->rlen >= 5 && memmem(c->rbuf, c->rlen, "\r\n0\r\n\r\n", 7) != NULL;
                else if (c->need && c->need != SIZE_MAX)
                    done = c->rlen >= c->need;
                if (eof)
                    done = true;
            }
            if (!done)
                continue;
            double l = now_s() - c->t0;
            tend = now_s();
            lat[nlat++] = l;
            if (c->req->round > 0)
                lat_steady[nsteady++] = l;
            else
                lat_first[nfirst++] = l;
            if (llog)
                fprintf(llog, "%d %d %.6f %.6f %.3f %d %d\n", c->req->round + 1, (int)((size_t)(c->req - reqs) % (size_t)o.tms),
                        c->t0 - t0, tend - t0, l * 1e3, c->status, (int)(c - cs));
            if (c->status >= 200 && c->status < 300) {
                ok++;
                ok_samples += c->req->series;
                tm_ok[(size_t)(c->req - reqs) % (size_t)o.tms] = 1;
            } else {
                errors++;
                if (!first_err[0]) {
                    char *b = memmem(c->rbuf, c->rlen, "\r\n\r\n", 4);
                    size_t bl = b ? c->rlen - (size_t)(b + 4 - c->rbuf) : 0;
                    snprintf(first_err, sizeof(first_err), "status %d: %.*s", c->status, (int)(bl > 300 ? 300 : bl),
                             b ? b + 4 : "");
                }
            }
            if (--round_left[c->req->round] == 0) {
                round_end[c->req->round] = tend;
                if (o.disk_from > 1 && c->req->round == o.disk_from - 2 && wb0 >= 0) {
                    wb0 = proc_write_bytes(o.pid); /* the window starts when round disk_from does */
                    twb0 = tend;
                }
            }
            c->busy = false;
            inflight--;
            if (eof || (c->need == SIZE_MAX))
                conn_close(c);
            else if (c->rlen > c->need && c->need) /* nothing should follow a response */
                conn_close(c);
        }
    }
    double cpu = cpu0 >= 0 ? proc_cpu_s(o.pid) - cpu0 : -1;
    long long wb1 = wb0 >= 0 ? proc_write_bytes(o.pid) : -1;
    double disk_mib = wb0 >= 0 && wb1 >= wb0 ? (double)(wb1 - wb0) / 1048576.0 : -1;
    qsort(lat_steady, nsteady, sizeof(double), cmp_double);
    double sp50 = nsteady ? lat_steady[(size_t)(0.50 * (double)(nsteady - 1))] : 0;
    double sp99 = nsteady ? lat_steady[(size_t)(0.99 * (double)(nsteady - 1) + 0.5)] : 0;
    qsort(lat_first, nfirst, sizeof(double), cmp_double);
    double fp50 = nfirst ? lat_first[(size_t)(0.50 * (double)(nfirst - 1))] : 0;
    double fp99 = nfirst ? lat_first[(size_t)(0.99 * (double)(nfirst - 1) + 0.5)] : 0;
    if (llog)
        fclose(llog);
    double secs = tend - t0;
    if (secs <= 0)
        secs = 1e-9;
    qsort(lat, nlat, sizeof(double), cmp_double);
    double p50 = nlat ? lat[(size_t)(0.50 * (double)(nlat - 1))] : 0;
    double p99 = nlat ? lat[(size_t)(0.99 * (double)(nlat - 1) + 0.5)] : 0;
    double mx = nlat ? lat[nlat - 1] : 0;
    size_t series = 0; /* distinct series the server holds: every TM with a push that got 2xx */
    for (int t = 0; t < o.tms; t++)
        if (tm_ok[t])
            series += reqs[t].series;
    long rss = o.pid ? proc_status_kb(o.pid, "VmRSS") : -1;
    long hwm = o.pid ? proc_status_kb(o.pid, "VmHWM") : -1;
    printf("%s: %zu/%zu pushes ok in %.2f s (%zu errors, %zu time-outs): %.1f pushes/s, %.0f samples/s, "
           "latency p50 %.1f ms p99 %.1f ms max %.1f ms, server RSS %.1f MiB (peak %.1f MiB)\n",
           o.name, ok, nreq, secs, errors, timeouts, (double)ok / secs, (double)ok_samples / secs, p50 * 1e3, p99 * 1e3,
           mx * 1e3, rss / 1024.0, hwm / 1024.0);
    /* Steady state: rounds 2..N, when every series exists already (Flink's every-10s pushes). */
    double steady = 0;
    if (o.rounds > 1 && round_end[0] > 0 && round_end[o.rounds - 1] > round_end[0]) {
        size_t later = 0;
        for (size_t k = (size_t)o.tms; k < nreq; k++)
            later += reqs[k].series;
        steady = (double)later / (round_end[o.rounds - 1] - round_end[0]);
    }
    for (int r = 0; r < o.rounds; r++)
        if (round_end[r] > 0)
            fprintf(stderr, "%s: round %d done at %.2f s (%.2f s)\n", o.name, r + 1, round_end[r] - t0,
                    round_end[r] - (r ? round_end[r - 1] : t0));
    if (first_err[0])
        printf("%s: first error: %s\n", o.name, first_err);
    printf("RESULT name=%s pushes=%zu ok=%zu errors=%zu timeouts=%zu seconds=%.3f pushes_s=%.2f "
           "samples_s=%.0f p50_ms=%.2f p99_ms=%.2f max_ms=%.2f rss_kb=%ld hwm_kb=%ld planned=%zu "
           "series=%zu steady_samples_s=%.0f first_round_s=%.3f cpu_s=%.2f cpu_s_per_1m=%.3f steady_p50_ms=%.2f "
           "steady_p99_ms=%.2f round1_p50_ms=%.2f round1_p99_ms=%.2f disk_mib=%.1f disk_mib_per_min=%.1f\n",
           o.name, nlat + timeouts, ok, errors, timeouts, secs, (double)ok / secs, (double)ok_samples / secs, p50 * 1e3,
           p99 * 1e3, mx * 1e3, rss, hwm, nreq, series, steady, round_end[0] > 0 ? round_end[0] - t0 : -1.0, cpu,
           cpu >= 0 && ok_samples ? cpu / ((double)ok_samples / 1e6) : -1.0, sp50 * 1e3, sp99 * 1e3, fp50 * 1e3,
           fp99 * 1e3, disk_mib, disk_mib >= 0 ? disk_mib * 60.0 / (twb0 >= 0 ? tend - twb0 : secs) : -1.0);
    for (int i = 0; i < o.conns; i++)
        conn_close(&cs[i]);
    return 0;
}
