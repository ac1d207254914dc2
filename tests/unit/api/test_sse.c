/* Unit tests for api/sse.c: the per-worker lists, and on a real two-worker server the SSE framing
 * (headers, retry hint, id/event/data frames, keep-alive), the resume point (Last-Event-ID header
 * or ?last_event_id=) and the shutdown fan-out that ends every stream on its own worker. The
 * control and flow streams on top are tested in tests/integration/test_{control,dashboard}.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/sse.h"

/* ---- lists ------------------------------------------------------------------------------------ */

typedef struct {
    int v;
    api_sse_link_t link;
} item_t;

static void list_expect(const api_sse_list_t *l, const int *want, size_t n)
{
    size_t i = 0;
    const api_sse_link_t *prev = NULL;
    for (const api_sse_link_t *x = l->head; x; prev = x, x = x->next, i++) {
        assert_true(i < n);
        assert_ptr_equal(x->prev, prev);
        assert_int_equal(API_SSE_OF(x, item_t, link)->v, want[i]);
    }
    assert_int_equal(i, n);
}

static void test_list(void **state)
{
    (void)state;
    api_sse_list_t l = {0};
    item_t it[4] = {{.v = 0}, {.v = 1}, {.v = 2}, {.v = 3}};
    for (int i = 0; i < 4; i++)
        api_sse_list_push(&l, &it[i].link);
    list_expect(&l, (int[]){3, 2, 1, 0}, 4);
    api_sse_list_remove(&l, &it[1].link); /* middle */
    list_expect(&l, (int[]){3, 2, 0}, 3);
    api_sse_list_remove(&l, &it[1].link); /* on no list: nothing happens */
    list_expect(&l, (int[]){3, 2, 0}, 3);
    api_sse_list_remove(&l, &it[3].link); /* head */
    api_sse_list_remove(&l, &it[0].link); /* tail */
    list_expect(&l, (int[]){2}, 1);
    api_sse_list_push(&l, &it[1].link);
    /* removing the visited node while walking, with next saved first */
    for (api_sse_link_t *x = l.head, *next; x; x = next) {
        next = x->next;
        api_sse_list_remove(&l, x);
    }
    assert_null(l.head);
}

/* ---- a server with an SSE endpoint ---------------------------------------------------------------- */

#define WORKERS 2

typedef struct {
    api_req_t *req;
    api_sse_link_t link;
} stream_t;

static api_sse_list_t streams[WORKERS];
static _Atomic int closers_run;

static void stream_closed(api_req_t *req, void *ud)
{
    stream_t *st = ud;
    api_sse_list_remove(&streams[req->worker], &st->link);
    free(st);
}

/* GET /sse: one "tick" event with id = resume point + 1, then a keep-alive; the stream stays open. */
static void h_sse(api_req_t *req, void *ud)
{
    (void)ud;
    uint64_t after = 0;
    int r = api_sse_last_event_id(req, &after);
    if (r < 0) {
        api_reply_text(req, 400, "bad Last-Event-ID");
        return;
    }
    stream_t *st = calloc(1, sizeof(*st));
    st->req = req;
    api_sse_list_push(&streams[req->worker], &st->link);
    api_sse_start(req, 1500, r ? "resumed" : NULL, stream_closed, st);
    assert_int_equal(api_sse_send(req, after + 1, "tick", "{\"a\":1}", 7), 0);
    api_sse_keepalive(req);
}

static void close_worker(void *ud, int worker)
{
    assert_ptr_equal(ud, streams);
    while (streams[worker].head) {
        stream_t *st = API_SSE_OF(streams[worker].head, stream_t, link);
        api_sse_list_remove(&streams[worker], &st->link);
        api_reply_stream_end(st->req);
        free(st);
    }
    atomic_fetch_add(&closers_run, 1);
}

static void on_shutdown(void *ud)
{
    api_sse_close_workers(ud, close_worker, streams);
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Sends a GET for target with extra header lines ("" for none). */
static void send_get(int fd, const char *target, const char *extra_headers)
{
    char req[512];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: t\r\n%s\r\n", target, extra_headers);
    assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
}

/* Reads until `until` shows up in what arrived (or 5 s pass). Returns the text (caller frees). */
static char *read_until(int fd, const char *until)
{
    size_t cap = 1 << 16, len = 0;
    char *b = calloc(1, cap + 1);
    while (!strstr(b, until) && len < cap) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0)
            break;
        ssize_t r = recv(fd, b + len, cap - len, 0);
        if (r <= 0)
            break;
        len += (size_t)r;
        b[len] = 0;
    }
    return b;
}

/* Connects, GETs target and reads until `until`; *got (caller frees) is what arrived. Returns the
 * socket. */
static int open_stream(int port, const char *target, const char *extra_headers, const char *until, char **got)
{
    int fd = connect_to(port);
    send_get(fd, target, extra_headers);
    *got = read_until(fd, until);
    return fd;
}

static void test_stream_framing_resume_and_shutdown(void **state)
{
    (void)state;
    api_server_options_t o = {.listen_address = "127.0.0.1:0",
                              .workers = WORKERS,
                              .max_connections = 64,
                              .max_body_bytes = 1 << 20,
                              .max_header_bytes = 16 << 10,
                              .read_timeout_ms = 10000};
    char err[256];
    api_server_t *srv = api_server_create(&o, err, sizeof(err));
    assert_non_null(srv);
    api_route_add(srv, API_GET, "/sse", "sse", h_sse, NULL);
    api_server_on_shutdown(srv, on_shutdown, srv);
    assert_int_equal(api_server_start(srv, err, sizeof(err)), 0);
    int port = api_server_port(srv);

    char *got;
    int a = open_stream(port, "/sse", "Last-Event-ID: 41\r\n", ": keepalive\n\n", &got);
    assert_non_null(strstr(got, "HTTP/1.1 200"));
    assert_non_null(strstr(got, "Content-Type: text/event-stream; charset=utf-8\r\n"));
    assert_non_null(strstr(got, "Cache-Control: no-store\r\n"));
    assert_non_null(strstr(got, "X-Accel-Buffering: no\r\n"));
    assert_non_null(strstr(got, "retry: 1500\n: resumed\n\n"));
    assert_non_null(strstr(got, "id: 42\nevent: tick\ndata: {\"a\":1}\n\n"));
    free(got);
    int b = open_stream(port, "/sse?last_event_id=7", "", ": keepalive\n\n", &got);
    assert_non_null(strstr(got, "id: 8\nevent: tick\n"));
    free(got);
    int c = open_stream(port, "/sse", "", ": keepalive\n\n", &got);
    assert_non_null(strstr(got, "retry: 1500\n\n"));
    assert_non_null(strstr(got, "id: 1\nevent: tick\n"));
    free(got);
    close(open_stream(port, "/sse", "Last-Event-ID: soon\r\n", "bad Last-Event-ID", &got));
    assert_non_null(strstr(got, "HTTP/1.1 400"));
    free(got);

    /* Shutdown ends the three open streams: each gets the last chunk. */
    api_server_stop(srv, 2000);
    assert_int_equal(atomic_load(&closers_run), WORKERS);
    int fds[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        got = read_until(fds[i], "0\r\n\r\n");
        assert_non_null(strstr(got, "0\r\n\r\n"));
        free(got);
        close(fds[i]);
    }
    api_server_destroy(srv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_stream_framing_resume_and_shutdown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
