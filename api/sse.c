/*
 * api/sse — per-worker request lists, SSE framing and the shutdown fan-out (contract in sse.h).
 *
 * The shutdown fan-out: one barrier per call, shared by the waiting thread and one task per
 * worker. Each task runs the caller's closer on its worker, then schedules its "done" on the
 * same loop 20 ms later (the answers the closer queued sit in bufferevents until a later turn of
 * the loop writes them). The waiter stops waiting when every task is done or after 5 s; the
 * barrier is freed by whoever lets go of it last, so a late task never touches freed memory.
 */
#include "api/sse.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "internal/util/buf.h"
#include "internal/util/clock.h"
#include "internal/util/parse.h"

#define SSE_FLUSH_PAUSE_US (20 * 1000)
#define SSE_CLOSE_WAIT_S 5

/* ---- lists ------------------------------------------------------------------------------------ */

void api_sse_list_push(api_sse_list_t *l, api_sse_link_t *n)
{
    n->prev = NULL;
    n->next = l->head;
    if (l->head)
        l->head->prev = n;
    l->head = n;
}

void api_sse_list_remove(api_sse_list_t *l, api_sse_link_t *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else if (l->head == n)
        l->head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

/* ---- event streams ---------------------------------------------------------------------------- */

void api_sse_start(api_req_t *req, int retry_ms, const char *comment, void (*on_close)(api_req_t *req, void *ud),
                   void *ud)
{
    api_reply_header(req, "Cache-Control", "no-store");
    api_reply_header(req, "X-Accel-Buffering", "no");
    api_reply_stream_start(req, 200, "text/event-stream; charset=utf-8", on_close, ud);
    char hello[256];
    int n = snprintf(hello, sizeof(hello), "retry: %d\n%s%s%s\n", retry_ms, comment ? ": " : "", comment ? comment : "",
                     comment ? "\n" : "");
    if (n > 0 && (size_t)n < sizeof(hello))
        api_reply_stream_chunk(req, hello, (size_t)n, NULL, NULL);
}

int api_sse_send(api_req_t *req, uint64_t id, const char *event, const char *data, size_t len)
{
    buf_t b = BUF_INIT;
    if (id)
        buf_printf(&b, "id: %llu\n", (unsigned long long)id);
    buf_printf(&b, "event: %s\ndata: ", event);
    buf_append(&b, data, len);
    buf_puts(&b, "\n\n");
    int rc = api_reply_stream_chunk(req, b.data, b.len, NULL, NULL);
    buf_free(&b);
    return rc;
}

void api_sse_keepalive(api_req_t *req)
{
    static const char ka[] = ": keepalive\n\n";
    api_reply_stream_chunk(req, ka, sizeof(ka) - 1, NULL, NULL);
}

int api_sse_last_event_id(api_req_t *req, uint64_t *after)
{
    const char *lei = api_req_header(req, "Last-Event-ID");
    if (!lei)
        lei = api_req_param(req, "last_event_id");
    if (!lei || !*lei)
        return 0;
    int64_t v;
    if (parse_int64(lei, &v) != 0 || v < 0)
        return -1;
    *after = (uint64_t)v;
    return 1;
}

/* ---- shutdown --------------------------------------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending; /* tasks not done yet */
    int refs;    /* the waiter + every task still scheduled */
    api_server_t *srv;
    void (*close)(void *ud, int worker);
    void *ud;
} sse_barrier_t;

typedef struct {
    sse_barrier_t *b;
    int worker;
} sse_close_task_t;

static void sse_barrier_unref(sse_barrier_t *b)
{
    pthread_mutex_lock(&b->mu);
    bool last = --b->refs == 0;
    pthread_mutex_unlock(&b->mu);
    if (!last)
        return;
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
}

static void sse_close_done(evutil_socket_t fd, short what, void *arg)
{
    sse_close_task_t *t = arg;
    sse_barrier_t *b = t->b;
    (void)fd;
    (void)what;
    free(t);
    pthread_mutex_lock(&b->mu);
    b->pending--;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    sse_barrier_unref(b);
}

static void sse_close_run(void *arg)
{
    sse_close_task_t *t = arg;
    sse_barrier_t *b = t->b;
    b->close(b->ud, t->worker);
    struct timeval flush = {0, SSE_FLUSH_PAUSE_US};
    if (event_base_once(api_server_worker_base(b->srv, t->worker), -1, EV_TIMEOUT, sse_close_done, t, &flush) != 0)
        sse_close_done(-1, 0, t);
}

void api_sse_close_workers(api_server_t *srv, void (*close)(void *ud, int worker), void *ud)
{
    sse_barrier_t *b = calloc(1, sizeof(*b));
    if (!b)
        return;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->srv = srv;
    b->close = close;
    b->ud = ud;
    b->refs = 1;
    int n = api_server_worker_count(srv);
    for (int i = 0; i < n; i++) {
        sse_close_task_t *t = malloc(sizeof(*t));
        if (!t)
            continue;
        t->b = b;
        t->worker = i;
        pthread_mutex_lock(&b->mu);
        b->pending++;
        b->refs++;
        pthread_mutex_unlock(&b->mu);
        if (api_server_run_on(srv, i, sse_close_run, t) != 0) {
            pthread_mutex_lock(&b->mu);
            b->pending--;
            b->refs--;
            pthread_mutex_unlock(&b->mu);
            free(t);
        }
    }
    struct timespec dl = clock_deadline_ms(CLOCK_REALTIME, SSE_CLOSE_WAIT_S * 1000);
    pthread_mutex_lock(&b->mu);
    while (b->pending > 0)
        if (pthread_cond_timedwait(&b->cv, &b->mu, &dl) != 0)
            break;
    pthread_mutex_unlock(&b->mu);
    sse_barrier_unref(b);
}
