/*
 * rules/notifier — the Alertmanager client; see notifier.h.
 *
 * Queue: a ring of rendered alert JSON objects (one malloc'd string each), guarded by mu. The
 * sender thread sleeps on cv until the queue is non-empty or stop is set, takes up to
 * RN_BATCH alerts, joins them into one JSON array and posts it to every Alertmanager, with
 * retries, outside the lock. Each Alertmanager has its own httpc connection, which only the
 * sender thread touches.
 */
#include "internal/rules/notifier.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal/net/httpc.h"
#include "internal/rules/rulefile.h"
#include "internal/util/clock.h"
#include "internal/util/log.h"

#define RN_BATCH 64
/* How much of an Alertmanager's error answer is kept for the log line. */
#define RN_MAX_RESPONSE_BODY 512

typedef struct {
    httpc_conn_t *conn; /* to <url>/api/v2/alerts */
    char *url;          /* as configured, for metrics and logs */
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

/* --- Alertmanager endpoints --------------------------------------------------------------------- */

/* The configured base URL, trailing '/' dropped, + "/api/v2/alerts"; one kept-alive connection
 * (internal/net/httpc), used only by the sender thread. */
static int rn_am_init(rn_am_t *am, const char *url, char *err, size_t errlen)
{
    size_t ul = strlen(url);
    while (ul > 0 && url[ul - 1] == '/')
        ul--;
    buf_t full = BUF_INIT;
    buf_append(&full, url, ul);
    buf_puts(&full, "/api/v2/alerts");
    httpc_url_t u;
    char uerr[256];
    int rc = httpc_url_parse(full.data, &u, uerr, sizeof(uerr));
    buf_free(&full);
    if (rc != 0) {
        snprintf(err, errlen, "alertmanager URL %s: %s", url, uerr);
        return -1;
    }
    am->conn = httpc_conn_new(&u);
    am->url = strdup(url);
    if (!am->conn || !am->url) {
        httpc_conn_free(am->conn);
        free(am->url);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static void rn_am_free(rn_am_t *am)
{
    httpc_conn_free(am->conn);
    free(am->url);
}

/* One POST of a JSON array of alerts. Returns 0 for a 2xx answer, or -1 with err (network error,
 * timeout, or the status and the start of Alertmanager's reason). */
static int rn_post(rn_am_t *am, const buf_t *body, int64_t timeout_ms, char *err, size_t errlen)
{
    httpc_response_t resp;
    httpc_response_init(&resp);
    int rc = httpc_post(am->conn, "Content-Type: application/json\r\n", body->data, body->len, timeout_ms,
                        RN_MAX_RESPONSE_BODY, &resp, err, errlen);
    if (rc == 0 && (resp.status < 200 || resp.status > 299)) {
        for (size_t i = 0; i < resp.body.len; i++)
            if ((unsigned char)resp.body.data[i] < 0x20)
                resp.body.data[i] = ' ';
        snprintf(err, errlen, "bad response status %d%s%s", resp.status, resp.body.len ? ": " : "",
                 resp.body.len ? resp.body.data : "");
        rc = -1;
    }
    httpc_response_free(&resp);
    return rc;
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
                char err[768] = "";
                if (rn_post(am, &body, n->timeout_ms, err, sizeof(err)) == 0) {
                    atomic_fetch_add(&am->sent, take);
                    any_ok = true;
                    break;
                }
                atomic_fetch_add(&am->errors, 1);
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
        if (rn_am_init(&n->ams[n->nams], o->urls[i], err, errlen) != 0)
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
    for (size_t i = 0; i < n->nams; i++)
        rn_am_free(&n->ams[i]);
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
    for (size_t i = 0; i < n->nams; i++)
        rn_am_free(&n->ams[i]);
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
