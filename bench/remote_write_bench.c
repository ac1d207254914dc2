/*
 * remote_write_bench — the load generator of bench/remote_write_bench.py: sends pre-built remote
 * write 1.0 requests (snappy + WriteRequest, encoded here by hand) over keep-alive HTTP/1.1 from
 * several sender threads, and prints what it sent.
 *
 *   remote_write_bench HOST PORT PATH SENDERS SERIES_PER_SENDER SAMPLES_PER_SERIES REQUESTS T0_MS
 *
 * Sender s owns series {__name__="bench_metric", sender="s", series="<i>", job="bench",
 * instance="host-<i % 100>:9100"}; its request r carries SAMPLES_PER_SERIES samples of each of its
 * series at T0_MS + (r * SAMPLES_PER_SERIES + k) * 1000 ms — every series moves forward in time,
 * one sample per second, so no receiver sees out-of-order or duplicate samples. Values are a
 * gauge-like random walk (what Flink exports). All bodies are built before the clock starts.
 *
 * Output (one line): "sent=<samples> requests=<n> wall_s=<seconds> errors=<non-2xx>".
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <snappy-c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char *data;
    size_t len, cap;
} wb_t;

static void wb_put(wb_t *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->data = realloc(b->data, b->cap);
        if (!b->data)
            abort();
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void wb_varint(wb_t *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    while (v >= 0x80) {
        t[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    t[n++] = (uint8_t)v;
    wb_put(b, t, n);
}

static void wb_lenfield(wb_t *b, int field, const void *p, size_t n)
{
    wb_varint(b, (uint64_t)field << 3 | 2);
    wb_varint(b, n);
    wb_put(b, p, n);
}

static void wb_label(wb_t *b, const char *name, const char *value)
{
    wb_t l = {0};
    wb_lenfield(&l, 1, name, strlen(name));
    wb_lenfield(&l, 2, value, strlen(value));
    wb_lenfield(b, 1, l.data, l.len);
    free(l.data);
}

typedef struct {
    const char *host, *path;
    int port, sender, nseries, nsamples, nreq;
    int64_t t0;
    char **bodies;
    size_t *lens;
    long errors;
    long sent_requests;
} sender_t;

static void build(sender_t *s)
{
    s->bodies = calloc((size_t)s->nreq, sizeof(char *));
    s->lens = calloc((size_t)s->nreq, sizeof(size_t));
    double *walk = calloc((size_t)s->nseries, sizeof(double));
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(s->sender + 1);
    for (int r = 0; r < s->nreq; r++) {
        wb_t req = {0};
        for (int i = 0; i < s->nseries; i++) {
            wb_t ts = {0};
            char sv[16], iv[16], inst[32];
            snprintf(sv, sizeof(sv), "%d", s->sender);
            snprintf(iv, sizeof(iv), "%d", i);
            snprintf(inst, sizeof(inst), "host-%d:9100", i % 100);
            wb_label(&ts, "__name__", "bench_metric");
            wb_label(&ts, "instance", inst);
            wb_label(&ts, "job", "bench");
            wb_label(&ts, "sender", sv);
            wb_label(&ts, "series", iv);
            for (int k = 0; k < s->nsamples; k++) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                walk[i] += (double)(rng % 2001) / 100.0 - 10.0;
                uint8_t smp[24];
                size_t n = 0;
                smp[n++] = 0x09;
                memcpy(smp + n, &walk[i], 8); /* little-endian host */
                n += 8;
                smp[n++] = 0x10;
                uint64_t t = (uint64_t)(s->t0 + ((int64_t)r * s->nsamples + k) * 1000);
                while (t >= 0x80) {
                    smp[n++] = (uint8_t)(t | 0x80);
                    t >>= 7;
                }
                smp[n++] = (uint8_t)t;
                wb_lenfield(&ts, 2, smp, n);
            }
            wb_lenfield(&req, 1, ts.data, ts.len);
            free(ts.data);
        }
        size_t clen = snappy_max_compressed_length(req.len);
        s->bodies[r] = malloc(clen);
        if (snappy_compress(req.data, req.len, s->bodies[r], &clen) != SNAPPY_OK)
            abort();
        s->lens[r] = clen;
        free(req.data);
    }
    free(walk);
}

static int connect_to(const sender_t *s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    inet_pton(AF_INET, s->host, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        perror("connect");
        exit(1);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads one response; returns the status code, or -1 if the connection closed. */
static int read_response(int fd)
{
    char buf[65536];
    size_t have = 0;
    for (;;) {
        ssize_t r = read(fd, buf + have, sizeof(buf) - 1 - have);
        if (r <= 0)
            return -1;
        have += (size_t)r;
        buf[have] = 0;
        char *end = strstr(buf, "\r\n\r\n");
        if (!end)
            continue;
        int code = atoi(buf + 9);
        long clen = 0;
        char *cl = strcasestr(buf, "\r\ncontent-length:");
        if (cl)
            clen = atol(cl + 17);
        size_t body_have = have - (size_t)(end + 4 - buf);
        while ((long)body_have < clen) {
            r = read(fd, buf, sizeof(buf));
            if (r <= 0)
                return -1;
            body_have += (size_t)r;
        }
        return code;
    }
}

static void *run(void *arg)
{
    sender_t *s = arg;
    int fd = connect_to(s);
    char hdr[512];
    for (int r = 0; r < s->nreq; r++) {
        int n = snprintf(hdr, sizeof(hdr),
                         "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/x-protobuf\r\n"
                         "Content-Encoding: snappy\r\nX-Prometheus-Remote-Write-Version: 0.1.0\r\n"
                         "Content-Length: %zu\r\n\r\n",
                         s->path, s->host, s->port, s->lens[r]);
        if (write_all(fd, hdr, (size_t)n) < 0 || write_all(fd, s->bodies[r], s->lens[r]) < 0) {
            s->errors++;
            close(fd);
            fd = connect_to(s);
            continue;
        }
        int code = read_response(fd);
        if (code < 200 || code > 299) {
            if (s->errors++ < 3)
                fprintf(stderr, "sender %d request %d: status %d\n", s->sender, r, code);
            if (code < 0) {
                close(fd);
                fd = connect_to(s);
            }
        }
        s->sent_requests++;
    }
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: %s HOST PORT PATH SENDERS SERIES SAMPLES REQUESTS T0_MS\n", argv[0]);
        return 2;
    }
    int nsend = atoi(argv[4]);
    sender_t *s = calloc((size_t)nsend, sizeof(*s));
    for (int i = 0; i < nsend; i++) {
        s[i] = (sender_t){.host = argv[1],
                          .port = atoi(argv[2]),
                          .path = argv[3],
                          .sender = i,
                          .nseries = atoi(argv[5]),
                          .nsamples = atoi(argv[6]),
                          .nreq = atoi(argv[7]),
                          .t0 = strtoll(argv[8], NULL, 10)};
        build(&s[i]);
    }
    printf("ready\n");
    fflush(stdout);
    /* The driver measures the server's CPU from here: wait for its go-ahead on stdin. */
    char line[16];
    if (!fgets(line, sizeof(line), stdin))
        return 2;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_t *th = calloc((size_t)nsend, sizeof(*th));
    for (int i = 0; i < nsend; i++)
        pthread_create(&th[i], NULL, run, &s[i]);
    long errors = 0, reqs = 0;
    for (int i = 0; i < nsend; i++) {
        pthread_join(th[i], NULL);
        errors += s[i].errors;
        reqs += s[i].sent_requests;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double wall = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    long long sent = (long long)nsend * s[0].nseries * s[0].nsamples * s[0].nreq;
    printf("sent=%lld requests=%ld wall_s=%.4f errors=%ld\n", sent, reqs, wall, errors);
    return 0;
}
