/*
 * rules/notifier — the Alertmanager client; see notifier.h.
 *
 * Queue: a ring of rendered alert JSON objects (one malloc'd string each), guarded by mu. The
 * sender thread sleeps on cv until the queue is non-empty or stop is set, takes up to
 * RN_BATCH alerts, joins them into one JSON array and posts it to every Alertmanager, with
 * retries, outside the lock.
 */
#include "internal/rules/notifier.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal/rules/rulefile.h"
#include "internal/util/clock.h"
#include "internal/util/log.h"

#define RN_BATCH 64

typedef struct {
    char *host;
    char *port;
    char *path; /* prefix + /api/v2/alerts */
    char *url;  /* as configured, for metrics and logs */
    _Atomic uint64_t sent, errors;
} rn_am_t;

struct rules_notifier {
    rn_am_t *ams;
    size_t nams;
    labels_t ext;
    size_t cap;
    int64_t timeout_ms, backoff_ms;
    int max_retries;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char **ring;
    size_t head, len;
    bool stop;
    pthread_t thread;
    _Atomic uint64_t dropped, queued;
};

/* --- JSON ------------------------------------------------------------------------------------------ */

/* Go's time.Time JSON (RFC 3339, UTC, fraction trimmed). */
static void rn_time(buf_t *b, int64_t ms)
{
    rules_format_time(ms, b);
}

void rules_notifier_alert_json(const rules_alert_note_t *a, const labels_t *ext, buf_t *out)
{
    buf_puts(out, "{\"labels\":{");
    /* merge the alert's labels (sorted) with the external labels the alert does not have */
    size_t i = 0, j = 0, n = 0;
    const labels_t *l = a->labels;
    size_t ne = ext ? ext->n : 0;
    while (i < l->n || j < ne) {
        const label_t *x;
        if (j >= ne || (i < l->n && strcmp(l->v[i].name, ext->v[j].name) <= 0)) {
            x = &l->v[i];
            if (j < ne && strcmp(l->v[i].name, ext->v[j].name) == 0)
                j++;
            i++;
        } else {
            x = &ext->v[j++];
        }
        if (n++)
            buf_putc(out, ',');
        buf_put_json_string(out, x->name, strlen(x->name));
        buf_putc(out, ':');
        buf_put_json_string(out, x->value, strlen(x->value));
    }
    buf_puts(out, "},\"annotations\":{");
    for (size_t k = 0; k < a->annotations->n; k++) {
        if (k)
            buf_putc(out, ',');
        const label_t *x = &a->annotations->v[k];
        buf_put_json_string(out, x->name, strlen(x->name));
        buf_putc(out, ':');
        buf_put_json_string(out, x->value, strlen(x->value));
    }
    buf_puts(out, "},\"startsAt\":\"");
    rn_time(out, a->starts_at_ms);
    buf_puts(out, "\",\"endsAt\":\"");
    rn_time(out, a->ends_at_ms);
    buf_puts(out, "\",\"generatorURL\":");
    const char *g = a->generator_url ? a->generator_url : "";
    buf_put_json_string(out, g, strlen(g));
    buf_putc(out, '}');
}

/* --- HTTP --------------------------------------------------------------------------------------------- */

static int rn_parse_url(const char *url, rn_am_t *am, char *err, size_t errlen)
{
    if (strncmp(url, "http://", 7) != 0) {
        snprintf(err, errlen, "alertmanager URL %s: only http:// is supported", url);
        return -1;
    }
    const char *h = url + 7;
    const char *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    char hostport[256];
    if (hl == 0 || hl >= sizeof(hostport)) {
        snprintf(err, errlen, "alertmanager URL %s: missing or too long host", url);
        return -1;
    }
    memcpy(hostport, h, hl);
    hostport[hl] = 0;
    char *colon = strrchr(hostport, ':');
    if (hostport[0] == '[') {
        char *rb = strchr(hostport, ']');
        colon = rb && rb[1] == ':' ? rb + 1 : NULL;
        if (rb)
            *rb = 0;
        am->host = strdup(hostport + 1);
    } else {
        if (colon)
            *colon = 0;
        am->host = strdup(hostport);
    }
    am->port = strdup(colon ? colon + 1 : "80");
    const char *prefix = slash ? slash : "";
    size_t pl = strlen(prefix);
    while (pl > 0 && prefix[pl - 1] == '/')
        pl--;
    buf_t p = BUF_INIT;
    buf_append(&p, prefix, pl);
    buf_puts(&p, "/api/v2/alerts");
    am->path = buf_steal(&p, NULL);
    am->url = strdup(url);
    return 0;
}

/* Waits for fd to become ready for `events` until deadline. 0 ready, -1 timeout/error. */
static int rn_wait(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - clock_mono_ms();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, (int)left);
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

/* One POST; returns the HTTP status, or -1 with err. */
static int rn_post(const rn_am_t *am, const char *body, size_t len, int64_t timeout_ms, char *err, size_t errlen)
{
    int64_t deadline = clock_mono_ms() + timeout_ms;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(am->host, am->port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "resolve %s: %s", am->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, p->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, p->ai_addr, p->ai_addrlen) != 0 && errno != EINPROGRESS) {
            snprintf(err, errlen, "connect: %s", strerror(errno));
            close(fd);
            fd = -1;
            continue;
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (rn_wait(fd, POLLOUT, deadline) != 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr) {
            snprintf(err, errlen, "connect: %s", soerr ? strerror(soerr) : "timeout");
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return -1;
    buf_t req = BUF_INIT;
    buf_printf(&req,
               "POST %s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: sluice\r\nContent-Type: application/json\r\n"
               "Content-Length: %zu\r\nConnection: close\r\n\r\n",
               am->path, am->host, am->port, len);
    buf_append(&req, body, len);
    size_t off = 0;
    int status = -1;
    while (off < req.len) {
        if (rn_wait(fd, POLLOUT, deadline) != 0) {
            snprintf(err, errlen, "write: timeout");
            goto out;
        }
        ssize_t w = send(fd, req.data + off, req.len - off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            snprintf(err, errlen, "write: %s", strerror(errno));
            goto out;
        }
        off += (size_t)w;
    }
    char resp[512];
    size_t got = 0;
    while (got < sizeof(resp) - 1) {
        if (rn_wait(fd, POLLIN, deadline) != 0) {
            snprintf(err, errlen, "read: timeout");
            goto out;
        }
        ssize_t r = recv(fd, resp + got, sizeof(resp) - 1 - got, 0);
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            snprintf(err, errlen, "read: %s", strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
        resp[got] = 0;
        if (strstr(resp, "\r\n"))
            break;
    }
    resp[got] = 0;
    int maj, min, code;
    if (sscanf(resp, "HTTP/%d.%d %d", &maj, &min, &code) == 3)
        status = code;
    else
        snprintf(err, errlen, "bad response");
out:
    buf_free(&req);
    close(fd);
    return status;
}

/* --- queue and sender ------------------------------------------------------------------------------ */

static void *rn_thread_main(void *arg)
{
    rules_notifier_t *n = arg;
    pthread_mutex_lock(&n->mu);
    for (;;) {
        while (!n->len && !n->stop)
            pthread_cond_wait(&n->cv, &n->mu);
        if (!n->len && n->stop)
            break;
        bool last = n->stop;
        size_t take = n->len < RN_BATCH ? n->len : RN_BATCH;
        buf_t body = BUF_INIT;
        buf_putc(&body, '[');
        for (size_t i = 0; i < take; i++) {
            char *s = n->ring[(n->head + i) % n->cap];
            if (i)
                buf_putc(&body, ',');
            buf_puts(&body, s);
            free(s);
        }
        buf_putc(&body, ']');
        n->head = (n->head + take) % n->cap;
        n->len -= take;
        pthread_mutex_unlock(&n->mu);

        bool any_ok = false;
        for (size_t a = 0; a < n->nams; a++) {
            rn_am_t *am = &n->ams[a];
            int64_t backoff = n->backoff_ms;
            int tries = last ? 1 : 1 + (n->max_retries > 0 ? n->max_retries : 0);
            for (int t = 0; t < tries; t++) {
                char err[256] = "";
                int st = rn_post(am, body.data, body.len, n->timeout_ms, err, sizeof(err));
                if (st >= 200 && st < 300) {
                    atomic_fetch_add(&am->sent, take);
                    any_ok = true;
                    break;
                }
                atomic_fetch_add(&am->errors, 1);
                if (st > 0)
                    snprintf(err, sizeof(err), "bad response status %d", st);
                log_warn("notifier", "error sending alerts to Alertmanager", LF_S("alertmanager", am->url),
                         LF_I("count", (int64_t)take), LF_I("attempt", t + 1), LF_S("err", err));
                if (t + 1 < tries) {
                    /* sleep, but wake early on stop */
                    pthread_mutex_lock(&n->mu);
                    if (!n->stop) {
                        struct timespec dl = clock_deadline_ms(CLOCK_REALTIME, backoff);
                        pthread_cond_timedwait(&n->cv, &n->mu, &dl);
                    }
                    bool stopping = n->stop;
                    pthread_mutex_unlock(&n->mu);
                    if (stopping)
                        break;
                    backoff *= 2;
                }
            }
        }
        if (!any_ok)
            atomic_fetch_add(&n->dropped, take);
        buf_free(&body);
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

rules_notifier_t *rules_notifier_new(const rules_notifier_options_t *o, char *err, size_t errlen)
{
    rules_notifier_t *n = calloc(1, sizeof(*n));
    if (!n) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    n->cap = o->queue_capacity ? o->queue_capacity : 10000;
    n->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    n->backoff_ms = o->backoff_ms > 0 ? o->backoff_ms : 500;
    n->max_retries = o->max_retries == 0 ? 3 : o->max_retries < 0 ? 0 : o->max_retries;
    n->ring = calloc(n->cap, sizeof(*n->ring));
    n->ams = calloc(o->nurls ? o->nurls : 1, sizeof(*n->ams));
    if (!n->ring || !n->ams) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < o->nurls; i++) {
        if (rn_parse_url(o->urls[i], &n->ams[n->nams], err, errlen) != 0)
            goto fail;
        n->nams++;
    }
    rules_labels_dup(&n->ext, o->external_labels);
    labels_sort(&n->ext);
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    if (pthread_create(&n->thread, NULL, rn_thread_main, n) != 0) {
        snprintf(err, errlen, "cannot start the notifier thread");
        pthread_mutex_destroy(&n->mu);
        pthread_cond_destroy(&n->cv);
        goto fail;
    }
    return n;
fail:
    for (size_t i = 0; i < n->nams; i++) {
        free(n->ams[i].host);
        free(n->ams[i].port);
        free(n->ams[i].path);
        free(n->ams[i].url);
    }
    rules_labels_free(&n->ext);
    free(n->ams);
    free(n->ring);
    free(n);
    return NULL;
}

void rules_notifier_send(void *ud, const rules_alert_note_t *alerts, size_t count)
{
    rules_notifier_t *n = ud;
    if (!n || n->nams == 0)
        return;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < count; i++) {
        buf_t b = BUF_INIT;
        rules_notifier_alert_json(&alerts[i], &n->ext, &b);
        if (n->len == n->cap) { /* full: the oldest goes */
            free(n->ring[n->head]);
            n->head = (n->head + 1) % n->cap;
            n->len--;
            atomic_fetch_add(&n->dropped, 1);
        }
        n->ring[(n->head + n->len) % n->cap] = buf_steal(&b, NULL);
        n->len++;
        atomic_fetch_add(&n->queued, 1);
    }
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

void rules_notifier_free(rules_notifier_t *n)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->mu);
    n->stop = true;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    pthread_join(n->thread, NULL);
    for (size_t i = 0; i < n->len; i++)
        free(n->ring[(n->head + i) % n->cap]);
    for (size_t i = 0; i < n->nams; i++) {
        free(n->ams[i].host);
        free(n->ams[i].port);
        free(n->ams[i].path);
        free(n->ams[i].url);
    }
    free(n->ams);
    free(n->ring);
    rules_labels_free(&n->ext);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n);
}

void rules_notifier_write_metrics(rules_notifier_t *n, buf_t *out)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->mu);
    size_t len = n->len;
    pthread_mutex_unlock(&n->mu);
    buf_puts(out, "# HELP sluice_notifications_sent_total Alerts sent to an Alertmanager.\n"
                  "# TYPE sluice_notifications_sent_total counter\n");
    for (size_t i = 0; i < n->nams; i++) {
        buf_puts(out, "sluice_notifications_sent_total{alertmanager=");
        buf_put_json_string(out, n->ams[i].url, strlen(n->ams[i].url));
        buf_printf(out, "} %llu\n", (unsigned long long)atomic_load(&n->ams[i].sent));
    }
    buf_puts(out, "# HELP sluice_notifications_errors_total Failed posts to an Alertmanager (each attempt).\n"
                  "# TYPE sluice_notifications_errors_total counter\n");
    for (size_t i = 0; i < n->nams; i++) {
        buf_puts(out, "sluice_notifications_errors_total{alertmanager=");
        buf_put_json_string(out, n->ams[i].url, strlen(n->ams[i].url));
        buf_printf(out, "} %llu\n", (unsigned long long)atomic_load(&n->ams[i].errors));
    }
    buf_printf(out,
               "# HELP sluice_notifications_dropped_total Alerts dropped: queue full, or no Alertmanager took "
               "them.\n# TYPE sluice_notifications_dropped_total counter\nsluice_notifications_dropped_total %llu\n"
               "# HELP sluice_notifications_queue_length Alerts waiting to be sent.\n"
               "# TYPE sluice_notifications_queue_length gauge\nsluice_notifications_queue_length %zu\n"
               "# HELP sluice_notifications_queue_capacity Most alerts the queue holds.\n"
               "# TYPE sluice_notifications_queue_capacity gauge\nsluice_notifications_queue_capacity %zu\n",
               (unsigned long long)atomic_load(&n->dropped), len, n->cap);
}
