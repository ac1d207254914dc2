/*
 * api/rules — /api/v1/rules, /api/v1/alerts and /-/reload; see rules.h.
 */
#include "api/rules.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "api/router.h"
#include "internal/util/log.h"

static api_rules_options_t ar;

static void ar_h_rules(api_req_t *req, void *ud)
{
    (void)ud;
    const char *t = api_req_param(req, "type");
    if (t && *t && strcmp(t, "alert") != 0 && strcmp(t, "record") != 0) {
        api_reply_prom_error(req, API_ERR_BAD_DATA, "invalid parameter \"type\": not supported value \"%s\"", t);
        return;
    }
    buf_t b = BUF_INIT;
    rules_manager_rules_json(ar.rules, t, &b);
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

static void ar_h_alerts(api_req_t *req, void *ud)
{
    (void)ud;
    buf_t b = BUF_INIT;
    rules_manager_alerts_json(ar.rules, &b);
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

typedef struct {
    api_req_t *req; /* NULL once the client left */
    int worker;
    int nerr;
    buf_t errs;
} ar_reload_t;

static void ar_reload_closed(api_req_t *req, void *ud)
{
    (void)req;
    ar_reload_t *r = ud;
    r->req = NULL; /* same worker as the reply: no race */
}

static void ar_reload_done(void *arg)
{
    ar_reload_t *r = arg;
    if (r->req) {
        if (r->nerr == 0) {
            api_reply(r->req, 200, "text/plain; charset=utf-8", "", 0);
        } else {
            /* one line, like Prometheus' "failed to reload config: ..." */
            for (size_t i = 0; i + 1 < r->errs.len; i++)
                if (r->errs.data[i] == '\n')
                    r->errs.data[i] = ';';
            api_reply_text(r->req, 500, "failed to reload config: %s", r->errs.data ? r->errs.data : "");
        }
    }
    buf_free(&r->errs);
    free(r);
}

static void *ar_reload_thread(void *arg)
{
    ar_reload_t *r = arg;
    r->nerr = ar.reload(ar.reload_ud, &r->errs);
    if (api_server_run_on(ar.srv, r->worker, ar_reload_done, r) != 0) {
        buf_free(&r->errs); /* the server is stopping; the request goes with it */
        free(r);
    }
    return NULL;
}

static void ar_h_reload(api_req_t *req, void *ud)
{
    (void)ud;
    ar_reload_t *r = calloc(1, sizeof(*r));
    pthread_t th;
    pthread_attr_t attr;
    if (!r) {
        api_reply_text(req, 500, "failed to reload config: out of memory");
        return;
    }
    r->req = req;
    r->worker = req->worker;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    api_req_park(req, ar_reload_closed, r);
    if (pthread_create(&th, &attr, ar_reload_thread, r) != 0) {
        /* answer synchronously instead */
        r->nerr = ar.reload(ar.reload_ud, &r->errs);
        pthread_attr_destroy(&attr);
        ar_reload_done(r);
        return;
    }
    pthread_attr_destroy(&attr);
}

void api_rules_register(const api_rules_options_t *o)
{
    ar = *o;
    api_route_add(API_GET, "/api/v1/rules", "rules", ar_h_rules, NULL);
    api_route_add(API_GET, "/api/v1/alerts", "alerts", ar_h_alerts, NULL);
    if (ar.reload)
        api_route_add(API_POST | API_PUT, "/-/reload", "reload", ar_h_reload, NULL);
}
