/*
 * api/rules — /api/v1/rules, /api/v1/alerts and /-/reload; see rules.h.
 */
#include "api/rules.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "api/control.h"
#include "api/router.h"
#include "internal/rules/actions.h"
#include "internal/rules/notifier.h"
#include "internal/rules/rulefile.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"

struct api_rules {
    api_server_t *srv;
    api_control_t *control; /* authorizes POST /-/reload like a flow-control change */
    rules_manager_t *rules;
    rules_notifier_t *notifier;
    rules_actions_t *actions;
    char *config_file;
    labels_t ext;
    size_t nams;               /* Alertmanager URLs */
    pthread_mutex_t reload_mu; /* one reload at a time */
    int (*also_reload)(void *ud, buf_t *errs);
    void *also_reload_ud;
};

static void ar_h_rules(api_req_t *req, void *ud)
{
    api_rules_t *ar = ud;
    const char *t = api_req_param(req, "type");
    if (t && *t && strcmp(t, "alert") != 0 && strcmp(t, "record") != 0) {
        api_reply_prom_error(req, API_ERR_BAD_DATA, "invalid parameter \"type\": not supported value \"%s\"", t);
        return;
    }
    buf_t b = BUF_INIT;
    rules_manager_rules_json(ar->rules, t, &b);
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

static void ar_h_alerts(api_req_t *req, void *ud)
{
    api_rules_t *ar = ud;
    buf_t b = BUF_INIT;
    rules_manager_alerts_json(ar->rules, &b);
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

typedef struct {
    api_rules_t *ar;
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
    r->nerr = api_rules_reload(r->ar, &r->errs);
    if (api_server_run_on(r->ar->srv, r->worker, ar_reload_done, r) != 0) {
        buf_free(&r->errs); /* the server is stopping; the request goes with it */
        free(r);
    }
    return NULL;
}

static void ar_h_reload(api_req_t *req, void *ud)
{
    api_rules_t *ar = ud;
    char who[160] = "";
    if (ar->control && api_control_authorize_change(ar->control, req, who, sizeof(who)) != 0)
        return;
    log_info("rules", "reload requested", LF_S("by", who));
    ar_reload_t *r = calloc(1, sizeof(*r));
    pthread_t th;
    pthread_attr_t attr;
    if (!r) {
        api_reply_text(req, 500, "failed to reload config: out of memory");
        return;
    }
    r->ar = ar;
    r->req = req;
    r->worker = req->worker;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    api_req_park(req, ar_reload_closed, r);
    if (pthread_create(&th, &attr, ar_reload_thread, r) != 0) {
        /* answer synchronously instead */
        r->nerr = api_rules_reload(ar, &r->errs);
        pthread_attr_destroy(&attr);
        ar_reload_done(r);
        return;
    }
    pthread_attr_destroy(&attr);
}

/* --- wiring ------------------------------------------------------------------------------------ */

static void ar_send(void *ud, const rules_alert_note_t *alerts, size_t n)
{
    api_rules_t *ar = ud;
    if (ar->notifier)
        rules_notifier_send(ar->notifier, alerts, n);
}

static void ar_transition(void *ud, const rules_alert_note_t *a, bool firing, int64_t ts)
{
    api_rules_t *ar = ud;
    if (ar->actions)
        rules_actions_on_transition(ar->actions, a, firing, ts);
}

static int ar_ctl_get(void *ud, const char *job, control_state_t *out)
{
    return api_control_get_state(ud, job, out);
}

static int ar_ctl_apply(void *ud, const char *job, const control_change_t *chg, const char *by, uint64_t *version,
                        char *err, size_t errlen)
{
    return api_control_apply(ud, job, chg, by, version, err, errlen);
}

static void ar_metrics(void *ud, buf_t *out)
{
    api_rules_t *ar = ud;
    rules_manager_write_metrics(ar->rules, out);
    rules_notifier_write_metrics(ar->notifier, out);
    rules_actions_write_metrics(ar->actions, out);
}

/* "a=b,c=d" -> sorted owned labels. */
static int ar_parse_labels(const char *s, labels_t *out, char *err, size_t errlen)
{
    out->v = NULL;
    out->n = 0;
    if (!s || !*s)
        return 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    out->v = calloc(cap, sizeof(*out->v));
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq || !labels_valid_name(p, (size_t)(eq - p))) {
            snprintf(err, errlen, "invalid external label \"%.*s\" (want name=value)", (int)len, p);
            rules_labels_free(out);
            return -1;
        }
        out->v[out->n].name = strndup(p, (size_t)(eq - p));
        out->v[out->n].value = strndup(eq + 1, len - (size_t)(eq - p) - 1);
        out->n++;
        p += len;
        if (*p == ',')
            p++;
    }
    labels_sort(out);
    if (labels_check_sorted_unique(out) != 0) {
        snprintf(err, errlen, "duplicate external label names in \"%s\"", s);
        rules_labels_free(out);
        return -1;
    }
    return 0;
}

/* Splits a '\n'-joined list into a NULL-terminated array of pointers into a copy. */
static char **ar_split(const char *list, size_t *n, char **storage)
{
    *storage = strdup(list ? list : "");
    size_t cap = 1;
    for (const char *p = *storage; *p; p++)
        cap += *p == '\n';
    char **v = calloc(cap + 1, sizeof(*v));
    *n = 0;
    for (char *p = *storage; p && *p;) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = 0;
        if (*p)
            v[(*n)++] = p;
        p = nl ? nl + 1 : NULL;
    }
    return v;
}

api_rules_t *api_rules_new(const api_rules_options_t *o, char *err, size_t errlen)
{
    api_rules_t *ar = calloc(1, sizeof(*ar));
    if (!ar) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&ar->reload_mu, NULL);
    ar->srv = o->srv;
    ar->control = o->control;
    if (ar_parse_labels(o->external_labels, &ar->ext, err, errlen) != 0)
        goto fail;
    char url[512];
    if (o->external_url && o->external_url[0]) {
        snprintf(url, sizeof(url), "%s", o->external_url);
        size_t l = strlen(url);
        while (l > 0 && url[l - 1] == '/')
            url[--l] = 0;
    } else {
        char host[256] = "localhost";
        gethostname(host, sizeof(host) - 1);
        snprintf(url, sizeof(url), "%s://%s:%d", o->srv && api_server_tls(o->srv) ? "https" : "http", host,
                 o->srv ? api_server_port(o->srv) : 9091);
    }
    char *amstore;
    size_t nams;
    char **ams = ar_split(o->alertmanager_urls, &nams, &amstore);
    if (nams) {
        rules_notifier_options_t no = {.urls = (const char *const *)ams,
                                       .nurls = nams,
                                       .external_labels = &ar->ext,
                                       .queue_capacity = (size_t)o->am_queue_capacity,
                                       .timeout_ms = o->am_timeout_ms};
        ar->notifier = rules_notifier_new(&no, err, errlen);
    }
    free(ams);
    free(amstore);
    ar->nams = nams;
    if (nams && !ar->notifier)
        goto fail;
    rules_control_ops_t ops = {.get = ar_ctl_get, .apply = ar_ctl_apply, .ud = o->control};
    ar->config_file = o->config_file ? strdup(o->config_file) : NULL;
    ar->also_reload = o->also_reload;
    ar->also_reload_ud = o->also_reload_ud;
    ar->actions = rules_actions_new(o->config_file, o->storage, &ops, err, errlen);
    if (!ar->actions)
        goto fail;
    rules_options_t ro = {.storage = o->storage,
                          .default_interval_ms = o->eval_interval_ms,
                          .external_labels = &ar->ext,
                          .external_url = url,
                          .lookback_ms = o->lookback_ms,
                          .query_timeout_ms = o->query_timeout_ms,
                          .max_samples = o->max_samples,
                          .max_memory = o->max_memory,
                          .resend_delay_ms = o->resend_delay_ms,
                          .outage_tolerance_ms = o->outage_tolerance_ms,
                          .for_grace_period_ms = o->for_grace_ms,
                          .hooks = {.ud = ar, .send = ar_send, .transition = ar_transition}};
    ar->rules = rules_manager_new(&ro);
    if (!ar->rules) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    char *pstore;
    size_t npat;
    char **pats = ar_split(o->rule_files, &npat, &pstore);
    buf_t errs = BUF_INIT;
    int nerr = rules_manager_load(ar->rules, (const char *const *)pats, npat, &errs);
    free(pats);
    free(pstore);
    if (nerr) {
        for (size_t i = 0; i + 1 < errs.len; i++)
            if (errs.data[i] == '\n')
                errs.data[i] = ';';
        snprintf(err, errlen, "error loading rules: %s", errs.data);
        buf_free(&errs);
        goto fail;
    }
    buf_free(&errs);
    log_info("rules", "rules ready", LF_I("groups", (int64_t)rules_manager_group_count(ar->rules)),
             LF_I("alertmanagers", (int64_t)nams), LF_I("actions", (int64_t)rules_actions_count(ar->actions)),
             LF_S("external_url", url));
    return ar;
fail:
    api_rules_free(ar);
    return NULL;
}

void api_rules_register_routes(api_rules_t *ar, api_server_t *srv)
{
    api_route_add(srv, API_GET, "/api/v1/rules", "rules", ar_h_rules, ar);
    api_route_add(srv, API_GET, "/api/v1/alerts", "alerts", ar_h_alerts, ar);
    api_route_add(srv, API_POST | API_PUT, "/-/reload", "reload", ar_h_reload, ar);
    metrics_register("rules", ar_metrics, ar);
}

void api_rules_start(api_rules_t *ar)
{
    if (ar->rules && rules_manager_start(ar->rules) != 0)
        log_error("rules", "cannot start the rule evaluation thread");
}

int api_rules_reload(api_rules_t *ar, buf_t *errs)
{
    pthread_mutex_lock(&ar->reload_mu);
    if (!ar->rules) { /* shutting down */
        pthread_mutex_unlock(&ar->reload_mu);
        return 0;
    }
    int nerr = rules_manager_reload(ar->rules, errs);
    if (nerr) {
        log_error("rules", "rule reload failed; the previous rules keep running",
                  LF_S("err", errs->data ? errs->data : ""));
    } else if (ar->actions) {
        char err[512];
        if (rules_actions_reload(ar->actions, ar->config_file, err, sizeof(err)) != 0) {
            buf_printf(errs, "%s\n", err);
            log_error("rules", "actions reload failed; the previous actions stay", LF_S("err", err));
            nerr = 1;
        }
    }
    if (ar->also_reload)
        nerr += ar->also_reload(ar->also_reload_ud, errs);
    pthread_mutex_unlock(&ar->reload_mu);
    return nerr;
}

void api_rules_shutdown(api_rules_t *ar)
{
    if (!ar)
        return;
    pthread_mutex_lock(&ar->reload_mu); /* waits for a reload in flight */
    rules_manager_free(ar->rules);      /* first: the evaluator calls the notifier and the actions */
    ar->rules = NULL;
    rules_notifier_free(ar->notifier);
    ar->notifier = NULL;
    rules_actions_free(ar->actions);
    ar->actions = NULL;
    pthread_mutex_unlock(&ar->reload_mu);
}

void api_rules_free(api_rules_t *ar)
{
    if (!ar)
        return;
    api_rules_shutdown(ar);
    free(ar->config_file);
    rules_labels_free(&ar->ext);
    pthread_mutex_destroy(&ar->reload_mu);
    free(ar);
}
