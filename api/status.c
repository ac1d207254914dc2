/* status — health, readiness, build/runtime info and /metrics; see status.h. */
#include "api/status.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "api/router.h"
#include "internal/util/buildinfo.h"
#include "internal/util/metrics.h"
#include "internal/util/parse.h"

struct api_status {
    api_status_options_t opt;
    _Atomic bool ready;
    _Atomic bool config_ok;
    _Atomic int64_t config_time; /* unix seconds of the last successful load */
};

api_status_t *api_status_new(const api_status_options_t *opt)
{
    api_status_t *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->opt = *opt;
    atomic_store(&st->config_ok, true);
    atomic_store(&st->config_time, (int64_t)time(NULL));
    return st;
}

void api_status_free(api_status_t *st)
{
    free(st);
}

void api_status_set_ready(api_status_t *st, bool ready)
{
    atomic_store(&st->ready, ready);
}

bool api_status_ready(const api_status_t *st)
{
    return atomic_load(&st->ready);
}

void api_status_note_config_load(api_status_t *st, bool success)
{
    atomic_store(&st->config_ok, success);
    if (success)
        atomic_store(&st->config_time, (int64_t)time(NULL));
}

static void status_healthy(api_req_t *req, void *ud)
{
    api_reply_text(req, 200, "sluice is Healthy.\n");
}

static void status_ready_h(api_req_t *req, void *ud)
{
    api_status_t *st = ud;
    if (api_status_ready(st))
        api_reply_text(req, 200, "sluice is Ready.\n");
    else
        api_reply_text(req, 503, "Service Unavailable\n");
}

static void put_field(buf_t *b, const char *key, const char *val, bool comma)
{
    if (comma)
        buf_putc(b, ',');
    buf_put_json_string(b, key, strlen(key));
    buf_putc(b, ':');
    buf_put_json_string(b, val, strlen(val));
}

static void status_buildinfo(api_req_t *req, void *ud)
{
    buf_t b = BUF_INIT;
    buf_putc(&b, '{');
    put_field(&b, "version", SLUICE_VERSION, false);
    put_field(&b, "revision", SLUICE_REVISION, true);
    put_field(&b, "branch", SLUICE_BRANCH, true);
    put_field(&b, "buildUser", SLUICE_BUILD_USER, true);
    put_field(&b, "buildDate", SLUICE_BUILD_DATE, true);
    put_field(&b, "goVersion", SLUICE_COMPILER, true);
    buf_putc(&b, '}');
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

static void status_flags(api_req_t *req, void *ud)
{
    api_status_t *st = ud;
    const char *j = st->opt.flags_json ? st->opt.flags_json : "{}";
    api_reply_prom_success(req, j, strlen(j));
}

static void rfc3339(double t, char *out, size_t cap)
{
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (int)((t - (double)s) * 1000));
}

static void status_runtimeinfo(api_req_t *req, void *ud)
{
    api_status_t *st = ud;
    buf_t b = BUF_INIT;
    char tmp[64], cwd[4096];
    rfc3339(metrics_process_start_time(), tmp, sizeof(tmp));
    buf_putc(&b, '{');
    put_field(&b, "startTime", tmp, false);
    put_field(&b, "CWD", getcwd(cwd, sizeof(cwd)) ? cwd : "", true);
    buf_printf(&b, ",\"reloadConfigSuccess\":%s", atomic_load(&st->config_ok) ? "true" : "false");
    rfc3339((double)atomic_load(&st->config_time), tmp, sizeof(tmp));
    put_field(&b, "lastConfigTime", tmp, true);
    buf_printf(&b, ",\"corruptionCount\":0,\"goroutineCount\":0,\"GOMAXPROCS\":%ld", sysconf(_SC_NPROCESSORS_ONLN));
    put_field(&b, "GOGC", "", true);
    put_field(&b, "GODEBUG", "", true);
    format_duration_ms(st->opt.retention_raw_ms, tmp, sizeof(tmp));
    put_field(&b, "storageRetention", tmp, true);
    buf_putc(&b, '}');
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

/* GET /metrics is the Pushgateway's: every pushed group, then sluice's own metrics. */
static void status_metrics(api_req_t *req, void *ud)
{
    buf_t b = BUF_INIT;
    metrics_write_all(&b);
    api_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len);
    buf_free(&b);
}

/* GET /-/metrics: sluice's own alone, for scraping sluice itself without the pushed data. */
static void status_metrics_self(api_req_t *req, void *ud)
{
    buf_t b = BUF_INIT;
    metrics_write_self(&b);
    api_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len);
    buf_free(&b);
}

void api_status_register_routes(api_status_t *st, api_server_t *srv)
{
    api_route_add(srv, API_GET, "/-/healthy", "healthy", status_healthy, st);
    api_route_add(srv, API_GET, "/-/ready", "ready", status_ready_h, st);
    api_route_add(srv, API_GET | API_POST, "/api/v1/status/buildinfo", "buildinfo", status_buildinfo, st);
    api_route_add(srv, API_GET, "/api/v1/status/flags", "flags", status_flags, st);
    api_route_add(srv, API_GET, "/api/v1/status/runtimeinfo", "runtimeinfo", status_runtimeinfo, st);
    api_route_add(srv, API_GET, "/metrics", "metrics", status_metrics, st);
    api_route_add(srv, API_GET, "/-/metrics", "metrics_self", status_metrics_self, st);
}
