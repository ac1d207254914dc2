/* Unit tests for api/server.c's read-ahead (libevent 2.1 reads 4 KiB per readiness; the server
 * reads the rest of what a plain socket holds itself): api__server_read_ahead on a socket pair
 * (everything waiting, nothing waiting, EOF, the per-call bound), and on a real two-worker server
 * the request bodies it must still frame exactly: a large body in one write, a body that arrives
 * in pieces, pipelined requests in one write; and a request handed to another thread (its arena
 * and body stolen, as push does) and answered from there, or left by its client first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/router.h"
#include "api/server.h"

/* A pattern no shift of itself repeats soon: a misplaced piece shows up in the comparison. */
static uint8_t pattern_byte(size_t i)
{
    return (uint8_t)((i * 2654435761u) >> 13);
}

static uint8_t *pattern(size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        p[i] = pattern_byte(i);
    return p;
}

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void send_all(int fd, const void *data, size_t n)
{
    const uint8_t *p = data;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        assert_true(w > 0);
        p += w;
        n -= (size_t)w;
    }
}

/* ---- api__server_read_ahead ---------------------------------------------------------------------- */

static void test_read_ahead_all_nothing_eof(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    struct evbuffer *b = evbuffer_new();

    /* nothing waits: nothing read, the buffer untouched */
    assert_int_equal(api__server_read_ahead(b, sv[0]), 0);
    assert_int_equal(evbuffer_get_length(b), 0);

    /* what waits is appended after what the buffer held, in order */
    evbuffer_add(b, "head", 4);
    size_t n = 100000;
    uint8_t *p = pattern(n);
    send_all(sv[1], p, n);
    assert_int_equal(api__server_read_ahead(b, sv[0]), n);
    assert_int_equal(evbuffer_get_length(b), n + 4);
    const uint8_t *all = evbuffer_pullup(b, -1);
    assert_memory_equal(all, "head", 4);
    assert_memory_equal(all + 4, p, n);

    /* EOF: the bytes before it, then 0 (the caller's own read reports the EOF) */
    send_all(sv[1], "tail", 4);
    close(sv[1]);
    assert_int_equal(api__server_read_ahead(b, sv[0]), 4);
    assert_int_equal(api__server_read_ahead(b, sv[0]), 0);
    assert_int_equal(evbuffer_get_length(b), n + 8);
    char tail[4];
    struct evbuffer_ptr at;
    assert_int_equal(evbuffer_ptr_set(b, &at, n + 4, EVBUFFER_PTR_SET), 0);
    assert_int_equal(evbuffer_copyout_from(b, &at, tail, 4), 4);
    assert_memory_equal(tail, "tail", 4);

    free(p);
    evbuffer_free(b);
    close(sv[0]);
}

typedef struct {
    int fd;
    const uint8_t *p;
    size_t n;
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    send_all(w->fd, w->p, w->n);
    close(w->fd);
    return NULL;
}

/* More than one call's worth: no call takes more than API_SERVER_READ_AHEAD, and the pieces add
 * up to the stream. */
static void test_read_ahead_bound(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    int big = 4 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    size_t n = 3 * API_SERVER_READ_AHEAD + 12345;
    uint8_t *p = pattern(n);
    writer_t w = {sv[1], p, n};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, writer_main, &w), 0);
    struct evbuffer *b = evbuffer_new();
    size_t got = 0;
    for (;;) {
        struct pollfd pf = {.fd = sv[0], .events = POLLIN};
        assert_true(poll(&pf, 1, 10000) > 0);
        size_t r = api__server_read_ahead(b, sv[0]);
        assert_true(r <= API_SERVER_READ_AHEAD);
        if (r == 0) {
            char c;
            if (recv(sv[0], &c, 1, 0) == 0)
                break; /* EOF */
            evbuffer_add(b, &c, 1);
            r = 1;
        }
        got += r;
    }
    pthread_join(th, NULL);
    assert_int_equal(got, n);
    assert_int_equal(evbuffer_get_length(b), n);
    assert_memory_equal(evbuffer_pullup(b, -1), p, n);
    free(p);
    evbuffer_free(b);
    close(sv[0]);
}

/* ---- a real server: request framing with the read-ahead ------------------------------------------ */

#define MAX_BODY (8u << 20)

/* PUT /echo: "<length> <fnv1a>" of the body it got. */
static void h_echo(api_req_t *req, void *ud)
{
    (void)ud;
    size_t n;
    const uint8_t *body = api_req_body(req, &n);
    api_reply_text(req, 200, "%zu %llx", n, (unsigned long long)fnv1a(body, n));
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Appends a PUT /echo of body[0:n] to out (a request head and its body). */
static void put_request(struct evbuffer *out, const uint8_t *body, size_t n)
{
    evbuffer_add_printf(out, "PUT /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", n);
    evbuffer_add(out, body, n);
}

/* Reads one response; returns its status, *text its body (caller frees). */
static int read_response(int fd, char **text)
{
    size_t cap = 1 << 16, len = 0;
    char *b = calloc(1, cap + 1);
    for (;;) {
        char *end = strstr(b, "\r\n\r\n");
        const char *cl = strstr(b, "Content-Length: ");
        if (end && cl && cl < end) {
            size_t want = (size_t)(end + 4 - b) + strtoul(cl + 16, NULL, 10);
            if (len >= want) {
                *text = strndup(end + 4, want - (size_t)(end + 4 - b));
                int code = atoi(b + 9);
                /* keep what follows (the next pipelined response) for the next call */
                memmove(b, b + want, len - want);
                len -= want;
                b[len] = 0;
                assert_int_equal(len, 0); /* one response per call in these tests */
                free(b);
                return code;
            }
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_true(poll(&p, 1, 10000) > 0);
        assert_true(len < cap);
        ssize_t r = recv(fd, b + len, 1, 0); /* one byte at a time: never past this response */
        assert_true(r > 0);
        len += (size_t)r;
        b[len] = 0;
    }
}

static void expect_echo(int fd, const uint8_t *body, size_t n)
{
    char *text, want[64];
    assert_int_equal(read_response(fd, &text), 200);
    snprintf(want, sizeof(want), "%zu %llx", n, (unsigned long long)fnv1a(body, n));
    assert_string_equal(text, want);
    free(text);
}

static void send_evbuffer(int fd, struct evbuffer *out)
{
    size_t n = evbuffer_get_length(out);
    send_all(fd, evbuffer_pullup(out, -1), n);
    evbuffer_drain(out, n);
}

/* A started two-worker server on an ephemeral port with one PUT route. */
static api_server_t *start_server(const char *path, api_handler_fn fn, void *ud)
{
    api_server_options_t o = {.listen_address = "127.0.0.1:0",
                              .workers = 2,
                              .max_connections = 64,
                              .max_body_bytes = MAX_BODY,
                              .max_header_bytes = 16 << 10,
                              .read_timeout_ms = 10000};
    char err[256];
    api_server_t *srv = api_server_create(&o, err, sizeof(err));
    assert_non_null(srv);
    api_route_add(srv, API_PUT, path, "test", fn, ud);
    assert_int_equal(api_server_start(srv, err, sizeof(err)), 0);
    return srv;
}

static void test_server_bodies(void **state)
{
    (void)state;
    api_server_t *srv = start_server("/echo", h_echo, NULL);
    int port = api_server_port(srv);
    int fd = connect_to(port);
    struct evbuffer *out = evbuffer_new();

    /* a body larger than any one read-ahead, in one write (the test's send blocks while the
     * server reads, so the server sees it arrive at its own pace) */
    size_t big = 5 * API_SERVER_READ_AHEAD / 2 + 7;
    uint8_t *p = pattern(big);
    put_request(out, p, big);
    send_evbuffer(fd, out);
    expect_echo(fd, p, big);

    /* the same connection, a body in pieces with pauses: the first piece fills libevent's 4 KiB
     * read, so the server reads ahead and finds the socket drained mid-body */
    size_t mid = 300000;
    evbuffer_add_printf(out, "PUT /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", mid);
    send_evbuffer(fd, out);
    const size_t cuts[] = {0, 9000, 9001, 150000, mid};
    for (size_t i = 0; i + 1 < sizeof(cuts) / sizeof(cuts[0]); i++) {
        send_all(fd, p + cuts[i], cuts[i + 1] - cuts[i]);
        nanosleep(&(struct timespec){0, 30 * 1000 * 1000}, NULL);
    }
    expect_echo(fd, p, mid);

    /* pipelined: three requests in one write, a large one between two small ones; each gets its
     * own body and its own response, in order */
    put_request(out, (const uint8_t *)"first", 5);
    put_request(out, p + 1, 700000);
    put_request(out, (const uint8_t *)"", 0);
    send_evbuffer(fd, out);
    expect_echo(fd, (const uint8_t *)"first", 5);
    expect_echo(fd, p + 1, 700000);
    expect_echo(fd, (const uint8_t *)"", 0);

    /* a body just over libevent's read on the same connection */
    put_request(out, p, 4097);
    send_evbuffer(fd, out);
    expect_echo(fd, p, 4097);

    close(fd);
    evbuffer_free(out);
    free(p);
    api_server_stop(srv, 2000);
    api_server_destroy(srv);
}

/* ---- a request answered from another thread -------------------------------------------------- */

/* PUT /later: parked, its arena and body stolen into a job that the handoff thread answers (the
 * echo text) through api_server_run_on once the test lets it go. Two references, as in push.c: the
 * thread's and the parked request's. */
typedef struct later_job {
    api_server_t *srv;
    api_req_t *req; /* NULL once the client left (worker thread only) */
    arena_t *arena;
    struct evbuffer *body;
    _Atomic int refs;
    int worker;
    char text[64];
    struct later_job *next;
} later_job_t;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    later_job_t *head;
    int queued, gone, answered;
    bool go, stop;
} later = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void later_unref(later_job_t *j)
{
    if (atomic_fetch_sub(&j->refs, 1) == 1) {
        evbuffer_free(j->body);
        arena_destroy(j->arena);
    }
}

static void later_gone(api_req_t *req, void *ud)
{
    (void)req;
    later_job_t *j = ud;
    j->req = NULL;
    pthread_mutex_lock(&later.mu);
    later.gone++;
    pthread_cond_broadcast(&later.cv);
    pthread_mutex_unlock(&later.mu);
    later_unref(j);
}

static void later_done(void *arg)
{
    later_job_t *j = arg;
    if (j->req) {
        api_reply(j->req, 200, "text/plain", j->text, strlen(j->text));
        j->req = NULL;
        later_unref(j);
    }
    pthread_mutex_lock(&later.mu);
    later.answered++;
    pthread_cond_broadcast(&later.cv);
    pthread_mutex_unlock(&later.mu);
    later_unref(j);
}

static void h_later(api_req_t *req, void *ud)
{
    (void)ud;
    api_server_t *srv = req->srv;
    later_job_t *j = arena_calloc(req->arena, 1, sizeof(*j));
    j->srv = srv;
    j->req = req;
    j->worker = req->worker;
    j->body = api_req_body_steal(req);
    if (!j->body) /* a worker thread: cmocka's asserts belong to the test's own */
        abort();
    atomic_init(&j->refs, 2);
    j->arena = api_req_arena_steal(req);
    api_req_park(req, later_gone, j);
    pthread_mutex_lock(&later.mu);
    j->next = later.head;
    later.head = j;
    later.queued++;
    pthread_cond_broadcast(&later.cv);
    pthread_mutex_unlock(&later.mu);
}

static void *later_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&later.mu);
    for (;;) {
        while (!later.stop && !(later.go && later.head))
            pthread_cond_wait(&later.cv, &later.mu);
        if (!later.head)
            break;
        later_job_t *j = later.head;
        later.head = j->next;
        pthread_mutex_unlock(&later.mu);
        size_t n = evbuffer_get_length(j->body); /* the body the request had, in the job's hands */
        snprintf(j->text, sizeof(j->text), "%zu %llx", n, (unsigned long long)fnv1a(evbuffer_pullup(j->body, -1), n));
        if (api_server_run_on(j->srv, j->worker, later_done, j) != 0)
            later_unref(j); /* the loops are gone: the teardown's close drops the other reference */
        pthread_mutex_lock(&later.mu);
    }
    pthread_mutex_unlock(&later.mu);
    return NULL;
}

static void later_wait(int *counter, int want)
{
    pthread_mutex_lock(&later.mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (*counter < want)
        if (pthread_cond_timedwait(&later.cv, &later.mu, &until) != 0)
            fail_msg("waited 10 s: queued %d, gone %d, answered %d", later.queued, later.gone, later.answered);
    pthread_mutex_unlock(&later.mu);
}

static void later_release(bool go)
{
    pthread_mutex_lock(&later.mu);
    later.go = go;
    pthread_cond_broadcast(&later.cv);
    pthread_mutex_unlock(&later.mu);
}

static void test_server_handoff(void **state)
{
    (void)state;
    api_server_t *srv = start_server("/later", h_later, NULL);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, later_main, NULL), 0);
    int port = api_server_port(srv);
    struct evbuffer *out = evbuffer_new();
    size_t big = 700000;
    uint8_t *p = pattern(big + 8);

    /* pipelined on one connection: each answered from the thread with its own body, in order */
    int fd = connect_to(port);
    const size_t sizes[] = {5, big, 0};
    for (size_t i = 0; i < 3; i++) {
        evbuffer_add_printf(out, "PUT /later HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", sizes[i]);
        evbuffer_add(out, p + i, sizes[i]);
    }
    send_evbuffer(fd, out);
    later_release(true);
    for (size_t i = 0; i < 3; i++)
        expect_echo(fd, p + i, sizes[i]);
    later_wait(&later.answered, 3);

    /* the client leaves while its request waits: evhttp does not read from a connection whose
     * request is unanswered, so the answer finds a closed socket; the connection still serves */
    later_release(false);
    int fd2 = connect_to(port);
    evbuffer_add_printf(out, "PUT /later HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", big);
    evbuffer_add(out, p, big);
    send_evbuffer(fd2, out);
    later_wait(&later.queued, 4);
    close(fd2);
    later_release(true);
    later_wait(&later.answered, 4);
    evbuffer_add_printf(out, "PUT /later HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc");
    send_evbuffer(fd, out);
    expect_echo(fd, (const uint8_t *)"abc", 3);

    /* shutdown with a request still held by the thread: the loops stop, so the thread cannot hand
     * its answer back (it drops its reference), and the server's teardown reports the request gone
     * (the other reference): the job is freed once, after both (ASan, LeakSanitizer) */
    later_release(false);
    evbuffer_add_printf(out, "PUT /later HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nxyz");
    send_evbuffer(fd, out);
    later_wait(&later.queued, 6);
    api_server_stop(srv, 200);
    pthread_mutex_lock(&later.mu);
    later.stop = true; /* runs what is queued, then ends */
    pthread_cond_broadcast(&later.cv);
    pthread_mutex_unlock(&later.mu);
    later_release(true);
    pthread_join(th, NULL);
    assert_int_equal(later.answered, 5);
    assert_int_equal(later.gone, 0);
    api_server_destroy(srv);
    assert_int_equal(later.gone, 1);
    close(fd);
    evbuffer_free(out);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_ahead_all_nothing_eof),
        cmocka_unit_test(test_read_ahead_bound),
        cmocka_unit_test(test_server_bodies),
        cmocka_unit_test(test_server_handoff),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
