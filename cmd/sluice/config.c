/*
 * config — the settings table and the two front ends that fill it (argv and a YAML file).
 *
 * Every setting is one row of config_options[]: flag name, kind, offset into config_t, default,
 * help. Setters parse a string for a row's kind, so flags and the config file share one parser
 * and one set of error messages. Errors name the flag and the bad value and end in a hint, like
 * kingpin does for Prometheus: "sluice: error: invalid duration "5x" for --retention.raw".
 */
#include "cmd/sluice/config.h"

#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "internal/util/buildinfo.h"
#include "internal/util/log.h"
#include "internal/util/parse.h"

/* OPT_LIST: a repeatable string flag; values are kept joined by '\n' (config_list_next splits). */
typedef enum { OPT_STRING, OPT_INT, OPT_DURATION, OPT_SIZE, OPT_BOOL, OPT_LIST } config_kind_t;

typedef struct {
    const char *name;
    config_kind_t kind;
    size_t offset;
    const char *def;
    const char *help;
    const char *const *choices; /* for OPT_STRING enums, NULL-terminated */
} config_option_t;

static const char *const log_levels[] = {"debug", "info", "warn", "error", NULL};
static const char *const log_formats[] = {"logfmt", "json", NULL};
static const char *const wal_fsync_modes[] = {"interval", "always", NULL};
static const char *const remote_read_on_error[] = {"warn", "fail", NULL};

#define OFF(f) offsetof(config_t, f)
static const config_option_t config_options[] = {
    {"config.file", OPT_STRING, OFF(config_file), "", "YAML file with the same settings as the flags (flags win).",
     NULL},
    {"web.listen-address", OPT_STRING, OFF(listen_address), ":9091",
     "Address to listen on for the HTTP API, pushes and the UI.", NULL},
    {"web.workers", OPT_INT, OFF(workers), "0",
     "HTTP worker threads, each with its own event loop (0 = number of CPUs).", NULL},
    {"web.max-connections", OPT_INT, OFF(max_connections), "4096",
     "Maximum simultaneous HTTP connections; more are answered 503 and closed.", NULL},
    {"web.max-body-size", OPT_SIZE, OFF(max_body_bytes), "32MiB", "Maximum request body size; larger bodies get 413.",
     NULL},
    {"web.max-header-size", OPT_SIZE, OFF(max_header_bytes), "64KiB", "Maximum size of a request's headers.", NULL},
    {"web.read-timeout", OPT_DURATION, OFF(read_timeout_ms), "30s",
     "Idle timeout while reading a request or writing a response.", NULL},
    {"web.shutdown-timeout", OPT_DURATION, OFF(shutdown_timeout_ms), "10s",
     "How long SIGTERM waits for in-flight requests.", NULL},
    {"web.enable-admin-api", OPT_BOOL, OFF(enable_admin_api), "false",
     "Enable admin endpoints (PUT /api/v1/admin/wipe).", NULL},
    {"web.control-token-file", OPT_STRING, OFF(control_token_file), "",
     "File of flow-control tokens, one name:token per line; without it, flow-control changes are accepted only from "
     "127.0.0.1/::1.",
     NULL},
    {"web.control-read-auth", OPT_BOOL, OFF(control_read_auth), "false",
     "Require a flow-control token (or 127.0.0.1/::1) for reading control states too.", NULL},
    {"storage.path", OPT_STRING, OFF(storage_path), "./data",
     "Data directory (WAL, snapshot, SQLite roll-ups and state).", NULL},
    {"retention.raw", OPT_DURATION, OFF(retention_raw_ms), "2h", "How long raw 1-second samples stay in memory.", NULL},
    {"storage.rollups", OPT_STRING, OFF(rollups), "1m:15d,1h:400d",
     "Roll-up resolutions and retentions in SQLite (\"\" = none).", NULL},
    {"storage.max-series", OPT_INT, OFF(max_series), "2000000",
     "Most series held in memory; new series beyond it are refused (0 = no limit).", NULL},
    {"storage.max-series-per-request", OPT_INT, OFF(max_series_per_request), "200000",
     "Most distinct series in one push or remote write (0 = no limit).", NULL},
    {"storage.max-future", OPT_DURATION, OFF(max_future_ms), "1h",
     "Samples stamped further ahead of the clock are refused (0 = no limit).", NULL},
    {"storage.max-samples-per-request", OPT_INT, OFF(max_samples_per_request), "2000000",
     "Most samples in one push or remote write (0 = no limit).", NULL},
    {"storage.snapshot-interval", OPT_DURATION, OFF(snapshot_interval_ms), "1h",
     "How often the in-memory tier is snapshotted (also on clean shutdown).", NULL},
    {"query.lookback-delta", OPT_DURATION, OFF(query_lookback_ms), "5m",
     "How far back PromQL looks for the latest sample of a series.", NULL},
    {"query.timeout", OPT_DURATION, OFF(query_timeout_ms), "2m", "Longest time a query may run before it is aborted.",
     NULL},
    {"query.max-samples", OPT_INT, OFF(query_max_samples), "50000000",
     "Most samples one query may hold in memory at once.", NULL},
    {"query.max-concurrency", OPT_INT, OFF(query_max_concurrency), "20",
     "Queries evaluated at once (query threads); more wait in a queue.", NULL},
    {"query.max-memory-per-query", OPT_SIZE, OFF(query_max_memory_per_query), "2GiB",
     "Most memory one query (or remote read request) may hold; more ends it with 422 (0 = no limit of its own).", NULL},
    {"query.max-memory", OPT_SIZE, OFF(query_max_memory), "4GiB",
     "Most memory all running queries and remote reads may hold together; a query that needs more while others hold "
     "it ends with 503 (0 = no limit). Rule evaluation is not charged.",
     NULL},
    {"storage.remote.read-sample-limit", OPT_INT, OFF(remote_read_sample_limit), "50000000",
     "Most samples one query of a SAMPLES remote read may return; more is a 400 (0 = no limit; streamed reads have "
     "none, as in Prometheus).",
     NULL},
    {"storage.remote.read-max-bytes-in-frame", OPT_SIZE, OFF(remote_read_max_bytes_in_frame), "1MiB",
     "Frame budget of streamed (STREAMED_XOR_CHUNKS) remote read responses.", NULL},
    {"push.group-ttl", OPT_DURATION, OFF(push_group_ttl_ms), "0",
     "Expire a push group this long after its last push (0 = never).", NULL},
    {"push.group-missed-intervals", OPT_INT, OFF(push_missed_intervals), "10",
     "Expire a push group that missed this many of its own push intervals (0 = never).", NULL},
    {"push.expected-interval", OPT_DURATION, OFF(push_expected_interval_ms), "0",
     "Heartbeat interval every push group is expected to keep (0 = each group's observed cadence; a job's own "
     "interval from the control API or --control.expected-jobs-file wins).",
     NULL},
    {"push.missing-intervals", OPT_INT, OFF(push_missing_intervals), "3",
     "An expected job that has not pushed for this many intervals is missing (sluice_job_up 0).", NULL},
    {"push.heartbeat-series-interval", OPT_DURATION, OFF(push_heartbeat_series_interval_ms), "10s",
     "How often the heartbeat series (sluice_push_*, sluice_job_*) are written to storage.", NULL},
    {"control.expected-jobs-file", OPT_STRING, OFF(control_expected_jobs_file), "",
     "File of jobs that must be running: one job per line, optionally \" interval=10s\"; reloaded on SIGHUP and "
     "POST /-/reload (docs/operations.md).",
     NULL},
    {"wal.fsync", OPT_STRING, OFF(wal_fsync), "interval",
     "interval: group commit fsyncs at least every --wal.fsync-interval; always: fsync before every reply.",
     wal_fsync_modes},
    {"wal.fsync-interval", OPT_DURATION, OFF(wal_fsync_interval_ms), "1s",
     "Longest time between WAL fsyncs (what kill -9 can lose at most).", NULL},
    {"rules.file", OPT_LIST, OFF(rules_files), "",
     "Prometheus rule file or glob (repeatable); reloaded on SIGHUP and POST /-/reload.", NULL},
    {"rules.evaluation-interval", OPT_DURATION, OFF(rules_eval_interval_ms), "1m",
     "Evaluation interval of rule groups that set none (Prometheus' evaluation_interval).", NULL},
    {"rules.external-labels", OPT_STRING, OFF(rules_external_labels), "",
     "Labels added to alerts sent to Alertmanager and shown as $externalLabels: name=value,name=value.", NULL},
    {"rules.alert.resend-delay", OPT_DURATION, OFF(rules_resend_delay_ms), "1m",
     "Minimum time between resends of a firing alert to Alertmanager.", NULL},
    {"rules.alert.for-grace-period", OPT_DURATION, OFF(rules_for_grace_ms), "10m",
     "Minimum time left of an alert's 'for' after a restart.", NULL},
    {"rules.alert.for-outage-tolerance", OPT_DURATION, OFF(rules_outage_tolerance_ms), "1h",
     "Longest outage after which an alert's 'for' state is still restored.", NULL},
    {"web.external-url", OPT_STRING, OFF(external_url), "",
     "URL under which sluice is reached ($externalURL, alerts' generatorURL); default http://<hostname>:<port>.", NULL},
    {"alertmanager.url", OPT_LIST, OFF(alertmanager_urls), "",
     "Alertmanager base URL to send alerts to, e.g. http://127.0.0.1:9093 (repeatable).", NULL},
    {"alertmanager.notification-queue-capacity", OPT_INT, OFF(alertmanager_queue_capacity), "10000",
     "Alerts queued for Alertmanager; beyond it the oldest are dropped.", NULL},
    {"alertmanager.timeout", OPT_DURATION, OFF(alertmanager_timeout_ms), "10s",
     "Timeout of one post to an Alertmanager (failed posts are retried with backoff).", NULL},
    {"remote-write.url", OPT_LIST, OFF(remote_write_urls), "",
     "Remote-write 1.0 receiver to forward every accepted sample to (repeatable): URL, then optional space-separated "
     "name=, header=Name:value, basic-auth-username=, basic-auth-password-file=, bearer-token-file=, retry-on-429= "
     "(docs/deploy.md).",
     NULL},
    {"external-label", OPT_LIST, OFF(external_labels), "",
     "name=value label added to every forwarded series that lacks it (repeatable).", NULL},
    {"remote-write.shards", OPT_INT, OFF(remote_write_shards), "4", "Concurrent senders per remote-write target.",
     NULL},
    {"remote-write.max-samples-per-send", OPT_INT, OFF(remote_write_max_samples_per_send), "2000",
     "Most samples in one remote-write request.", NULL},
    {"remote-write.timeout", OPT_DURATION, OFF(remote_write_timeout_ms), "30s", "Timeout of one remote-write request.",
     NULL},
    {"remote-write.min-backoff", OPT_DURATION, OFF(remote_write_min_backoff_ms), "30ms",
     "First retry delay after a 5xx or network error (doubles per retry).", NULL},
    {"remote-write.max-backoff", OPT_DURATION, OFF(remote_write_max_backoff_ms), "5s", "Longest retry delay.", NULL},
    {"remote-write.retry-on-http-429", OPT_BOOL, OFF(remote_write_retry_on_429), "false",
     "Retry batches answered 429 (honouring Retry-After) instead of dropping them.", NULL},
    {"remote-write.wal-max-hold", OPT_DURATION, OFF(remote_write_wal_max_hold_ms), "24h",
     "Keep WAL segments that are not yet forwarded at most this long (0 = until sent; the disk may fill).", NULL},
    {"remote-write.tls-ca-file", OPT_STRING, OFF(remote_write_tls_ca_file), "",
     "CA certificates (PEM) that https:// remote-write receivers are verified against (default: the system store).",
     NULL},
    {"remote-write.tls-cert-file", OPT_STRING, OFF(remote_write_tls_cert_file), "",
     "Client certificate (PEM) presented to https:// remote-write receivers (mTLS); with --remote-write.tls-key-file.",
     NULL},
    {"remote-write.tls-key-file", OPT_STRING, OFF(remote_write_tls_key_file), "",
     "Private key (PEM) of --remote-write.tls-cert-file.", NULL},
    {"remote-write.tls-server-name", OPT_STRING, OFF(remote_write_tls_server_name), "",
     "Name sent as SNI and verified in the receiver's certificate (default: the URL's host).", NULL},
    {"remote-write.tls-insecure-skip-verify", OPT_BOOL, OFF(remote_write_tls_insecure_skip_verify), "false",
     "Do not verify remote-write receivers' certificates (testing only).", NULL},
    {"web.config.file", OPT_STRING, OFF(web_config_file), "",
     "Prometheus-style web configuration (TLS, mTLS, basic auth with bcrypt hashes) for every endpoint; reloaded on "
     "SIGHUP (docs/deploy.md).",
     NULL},
    {"remote-read.url", OPT_LIST, OFF(remote_read_urls), "",
     "Remote-read endpoint PromQL falls through to for data older than sluice holds (repeatable): URL, then optional "
     "space-separated name=, header=Name:value, basic-auth-username=, basic-auth-password-file=, bearer-token-file=, "
     "response-type=streamed|samples, tls-ca-file=, tls-cert-file=, tls-key-file=, tls-server-name=, "
     "tls-insecure-skip-verify= (docs/deploy.md).",
     NULL},
    {"remote-read.read-recent", OPT_BOOL, OFF(remote_read_recent), "false",
     "Also ask the remote-read endpoints for the range sluice holds (merged by timestamp, sluice's sample wins).",
     NULL},
    {"remote-read.timeout", OPT_DURATION, OFF(remote_read_timeout_ms), "1m", "Timeout of one remote-read request.",
     NULL},
    {"remote-read.on-error", OPT_STRING, OFF(remote_read_on_error), "warn",
     "A failing remote-read endpoint: warn = answer from the rest with a warning (partial response); fail = the query "
     "fails (422, or 503 when unreachable).",
     remote_read_on_error},
    {"remote-read.max-response-size", OPT_SIZE, OFF(remote_read_max_response_bytes), "256MiB",
     "Largest remote-read response (compressed and decompressed); a larger one is a remote-read error.", NULL},
    {"remote-read.tls-ca-file", OPT_STRING, OFF(remote_read_tls_ca_file), "",
     "CA certificates (PEM) that https:// remote-read endpoints are verified against (default: the system store).",
     NULL},
    {"remote-read.tls-cert-file", OPT_STRING, OFF(remote_read_tls_cert_file), "",
     "Client certificate (PEM) presented to https:// remote-read endpoints (mTLS); with --remote-read.tls-key-file.",
     NULL},
    {"remote-read.tls-key-file", OPT_STRING, OFF(remote_read_tls_key_file), "",
     "Private key (PEM) of --remote-read.tls-cert-file.", NULL},
    {"remote-read.tls-server-name", OPT_STRING, OFF(remote_read_tls_server_name), "",
     "Name sent as SNI and verified in the endpoint's certificate (default: the URL's host).", NULL},
    {"remote-read.tls-insecure-skip-verify", OPT_BOOL, OFF(remote_read_tls_insecure_skip_verify), "false",
     "Do not verify remote-read endpoints' certificates (testing only).", NULL},
    {"log.level", OPT_STRING, OFF(log_level), "info", "Log level: debug, info, warn, error.", log_levels},
    {"log.format", OPT_STRING, OFF(log_format), "logfmt", "Log format: logfmt or json.", log_formats},
};
#define CONFIG_NOPTS (sizeof(config_options) / sizeof(config_options[0]))

static const config_option_t *config_find(const char *name, size_t len)
{
    for (size_t i = 0; i < CONFIG_NOPTS; i++)
        if (strlen(config_options[i].name) == len && memcmp(config_options[i].name, name, len) == 0)
            return &config_options[i];
    return NULL;
}

static int config_set(config_t *c, const config_option_t *o, const char *val, const char *where, char *err,
                      size_t errlen)
{
    void *field = (char *)c + o->offset;
    switch (o->kind) {
    case OPT_LIST:
        if (val[0] && *(char **)field && (*(char **)field)[0]) {
            buf_t joined = BUF_INIT;
            buf_printf(&joined, "%s\n%s", *(char **)field, val);
            free(*(char **)field);
            *(char **)field = buf_steal(&joined, NULL);
            return 0;
        }
        free(*(char **)field);
        *(char **)field = strdup(val);
        return 0;
    case OPT_STRING:
        if (o->choices) {
            bool ok = false;
            for (const char *const *ch = o->choices; *ch; ch++)
                ok = ok || strcmp(*ch, val) == 0;
            if (!ok) {
                snprintf(err, errlen, "invalid value \"%s\" for %s%s (allowed: %s)", val, where, o->name,
                         o->choices == log_levels             ? "debug, info, warn, error"
                         : o->choices == wal_fsync_modes      ? "interval, always"
                         : o->choices == remote_read_on_error ? "warn, fail"
                                                              : "logfmt, json");
                return -1;
            }
        }
        free(*(char **)field);
        *(char **)field = strdup(val);
        return 0;
    case OPT_INT: {
        int64_t v;
        if (parse_int64(val, &v) != 0 || v < 0) {
            snprintf(err, errlen, "invalid non-negative integer \"%s\" for %s%s", val, where, o->name);
            return -1;
        }
        *(int64_t *)field = v;
        return 0;
    }
    case OPT_DURATION: {
        int64_t v;
        if (parse_duration_ms(val, &v) != 0) {
            snprintf(err, errlen, "invalid duration \"%s\" for %s%s (e.g. 30s, 5m, 2h, 15d)", val, where, o->name);
            return -1;
        }
        *(int64_t *)field = v;
        return 0;
    }
    case OPT_SIZE: {
        uint64_t v;
        if (parse_size_bytes(val, &v) != 0) {
            snprintf(err, errlen, "invalid size \"%s\" for %s%s (e.g. 512KiB, 32MiB)", val, where, o->name);
            return -1;
        }
        *(uint64_t *)field = v;
        return 0;
    }
    case OPT_BOOL: {
        bool v;
        if (parse_bool(val, &v) != 0) {
            snprintf(err, errlen, "invalid boolean \"%s\" for %s%s", val, where, o->name);
            return -1;
        }
        *(bool *)field = v;
        return 0;
    }
    }
    return -1;
}

void config_init(config_t *c)
{
    memset(c, 0, sizeof(*c));
    char err[256];
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        int rc = config_set(c, &config_options[i], config_options[i].def, "--", err, sizeof(err));
        (void)rc;
        assert(rc == 0 && "embedded defaults must parse");
    }
}

void config_free(config_t *c)
{
    for (size_t i = 0; i < CONFIG_NOPTS; i++)
        if (config_options[i].kind == OPT_STRING || config_options[i].kind == OPT_LIST) {
            char **p = (char **)((char *)c + config_options[i].offset);
            free(*p);
            *p = NULL;
        }
}

void config_print_help(const char *prog, FILE *out)
{
    fprintf(out,
            "usage: %s [<flags>]\n\n"
            "sluice keeps the history of what Flink pushes, serves it through the Prometheus APIs,\n"
            "and steers running jobs (rate limit, pause, flood discharge).\n\nFlags:\n"
            "  -h, --help                     Show this help and exit.\n"
            "      --version                  Show the version and exit.\n",
            prog);
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const config_option_t *o = &config_options[i];
        char left[64];
        if (o->kind == OPT_BOOL)
            snprintf(left, sizeof(left), "--[no-]%s", o->name);
        else
            snprintf(left, sizeof(left), "--%s=VALUE", o->name);
        fprintf(out, "      %-30s %s", left, o->help);
        if (o->def[0])
            fprintf(out, " (default: %s)", o->def);
        fputc('\n', out);
    }
}

static void config_print_version(FILE *out)
{
    fprintf(out, "sluice, version %s (branch: %s, revision: %s)\n  build user: %s\n  build date: %s\n  compiler: %s\n",
            SLUICE_VERSION, SLUICE_BRANCH, SLUICE_REVISION, SLUICE_BUILD_USER, SLUICE_BUILD_DATE, SLUICE_COMPILER);
}

/* One pass over argv. With only_config_file, applies --config.file and skips the rest, so the file
 * can be loaded before the flags that override it. */
static config_parse_result_t config_apply_args(config_t *c, int argc, char **argv, bool only_config_file, char *err,
                                               size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            if (!only_config_file)
                config_print_help("sluice", stdout);
            return CONFIG_PARSE_EXIT_OK;
        }
        if (strcmp(a, "--version") == 0) {
            if (!only_config_file)
                config_print_version(stdout);
            return CONFIG_PARSE_EXIT_OK;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s', try --help", a);
            return CONFIG_PARSE_ERROR;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const config_option_t *o = config_find(name, nlen);
        const char *val = eq ? eq + 1 : NULL;
        bool negated = false;
        if (!o && nlen > 3 && strncmp(name, "no-", 3) == 0) {
            o = config_find(name + 3, nlen - 3);
            if (o && o->kind == OPT_BOOL && !eq)
                negated = true;
            else
                o = NULL;
        }
        if (!o) {
            snprintf(err, errlen, "unknown long flag '--%.*s', try --help", (int)nlen, name);
            return CONFIG_PARSE_ERROR;
        }
        if (o->kind == OPT_BOOL && !val)
            val = negated ? "false" : "true";
        if (!val) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "expected argument for flag '--%s'", o->name);
                return CONFIG_PARSE_ERROR;
            }
            val = argv[++i];
        }
        if (only_config_file != (strcmp(o->name, "config.file") == 0))
            continue;
        if (config_set(c, o, val, "flag --", err, errlen) != 0)
            return CONFIG_PARSE_ERROR;
    }
    return CONFIG_PARSE_OK;
}

config_parse_result_t config_parse_args(config_t *c, int argc, char **argv, char *err, size_t errlen)
{
    config_parse_result_t r = config_apply_args(c, argc, argv, true, err, errlen);
    if (r != CONFIG_PARSE_OK) {
        if (r == CONFIG_PARSE_EXIT_OK)
            r = config_apply_args(c, argc, argv, false, err, errlen);
        return r;
    }
    if (c->config_file && c->config_file[0] && config_load_file(c, c->config_file, err, errlen) != 0)
        return CONFIG_PARSE_ERROR;
    r = config_apply_args(c, argc, argv, false, err, errlen);
    if (r != CONFIG_PARSE_OK)
        return r;
    return config_validate(c, err, errlen) == 0 ? CONFIG_PARSE_OK : CONFIG_PARSE_ERROR;
}

int config_validate(const config_t *c, char *err, size_t errlen)
{
    if (c->max_body_bytes == 0) {
        snprintf(err, errlen, "--web.max-body-size must be greater than 0");
        return -1;
    }
    if (c->max_header_bytes < 1024) {
        snprintf(err, errlen, "--web.max-header-size must be at least 1KiB");
        return -1;
    }
    if (c->read_timeout_ms < 1000) {
        snprintf(err, errlen, "--web.read-timeout must be at least 1s");
        return -1;
    }
    if (c->retention_raw_ms < 60000) {
        snprintf(err, errlen, "--retention.raw must be at least 1m");
        return -1;
    }
    if (c->workers > 256) {
        snprintf(err, errlen, "--web.workers must be at most 256");
        return -1;
    }
    if (c->wal_fsync_interval_ms < 1 || c->wal_fsync_interval_ms > 60000) {
        snprintf(err, errlen, "--wal.fsync-interval must be between 1ms and 1m");
        return -1;
    }
    if (c->remote_write_shards < 1 || c->remote_write_shards > 256 || c->remote_write_max_samples_per_send < 1 ||
        c->remote_write_max_samples_per_send > 1000000) {
        snprintf(err, errlen,
                 "--remote-write.shards must be 1..256 and --remote-write.max-samples-per-send 1..1000000");
        return -1;
    }
    if (c->query_max_concurrency < 1 || c->query_max_concurrency > 1024) {
        snprintf(err, errlen, "--query.max-concurrency must be between 1 and 1024");
        return -1;
    }
    if (!c->storage_path[0]) {
        snprintf(err, errlen, "--storage.path must not be empty");
        return -1;
    }
    return 0;
}

/* --- YAML ------------------------------------------------------------------------------------ */

typedef struct {
    config_t *c;
    const char *path;
    char *err;
    size_t errlen;
} config_yaml_ctx_t;

static int config_yaml_node(config_yaml_ctx_t *x, yaml_document_t *doc, yaml_node_t *node, const char *prefix)
{
    if (node->type != YAML_MAPPING_NODE) {
        snprintf(x->err, x->errlen, "config file %s: line %zu: expected a mapping of settings", x->path,
                 node->start_mark.line + 1);
        return -1;
    }
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        if (!k || !v || k->type != YAML_SCALAR_NODE) {
            snprintf(x->err, x->errlen, "config file %s: invalid key", x->path);
            return -1;
        }
        char name[256];
        snprintf(name, sizeof(name), "%s%s%s", prefix, prefix[0] ? "." : "", (const char *)k->data.scalar.value);
        if (!prefix[0] && strcmp(name, "actions") == 0)
            continue; /* the rules' closed-loop bindings: read by internal/rules/actions */
        if (v->type == YAML_MAPPING_NODE) {
            if (config_yaml_node(x, doc, v, name) != 0)
                return -1;
            continue;
        }
        const config_option_t *o = config_find(name, strlen(name));
        if (!o || strcmp(name, "config.file") == 0) {
            snprintf(x->err, x->errlen, "config file %s: line %zu: unknown setting '%s'", x->path,
                     k->start_mark.line + 1, name);
            return -1;
        }
        if (v->type == YAML_SEQUENCE_NODE && o->kind == OPT_LIST) {
            for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
                yaml_node_t *e = yaml_document_get_node(doc, *it);
                if (!e || e->type != YAML_SCALAR_NODE) {
                    snprintf(x->err, x->errlen, "config file %s: line %zu: '%s' must be a list of strings", x->path,
                             v->start_mark.line + 1, name);
                    return -1;
                }
                char msg[512];
                if (config_set(x->c, o, (const char *)e->data.scalar.value, "", msg, sizeof(msg)) != 0) {
                    snprintf(x->err, x->errlen, "config file %s: %s", x->path, msg);
                    return -1;
                }
            }
            continue;
        }
        if (v->type != YAML_SCALAR_NODE) {
            snprintf(x->err, x->errlen, "config file %s: line %zu: '%s' must be a single value", x->path,
                     v->start_mark.line + 1, name);
            return -1;
        }
        char where[300], msg[512];
        snprintf(where, sizeof(where), "config file %s: line %zu: ", x->path, v->start_mark.line + 1);
        if (config_set(x->c, o, (const char *)v->data.scalar.value, "", msg, sizeof(msg)) != 0) {
            snprintf(x->err, x->errlen, "%s%s", where, msg);
            return -1;
        }
    }
    return 0;
}

int config_load_file(config_t *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open config file %s: %s", path, strerror(errno));
        return -1;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = -1;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        snprintf(err, errlen, "config file %s: YAML parser init failed", path);
        return -1;
    }
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        snprintf(err, errlen, "config file %s: line %zu: %s", path, parser.problem_mark.line + 1,
                 parser.problem ? parser.problem : "YAML syntax error");
        goto out_parser;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    config_yaml_ctx_t x = {c, path, err, errlen};
    rc = root ? config_yaml_node(&x, &doc, root, "") : 0; /* an empty file sets nothing */
    yaml_document_delete(&doc);
out_parser:
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
}

void config_format_yaml(const config_t *c, buf_t *out)
{
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const config_option_t *o = &config_options[i];
        const void *field = (const char *)c + o->offset;
        char tmp[64];
        const char *val = tmp;
        switch (o->kind) {
        case OPT_STRING:
        case OPT_LIST: val = *(char *const *)field ? *(char *const *)field : ""; break;
        case OPT_INT: snprintf(tmp, sizeof(tmp), "%lld", (long long)*(const int64_t *)field); break;
        case OPT_DURATION: format_duration_ms(*(const int64_t *)field, tmp, sizeof(tmp)); break;
        case OPT_SIZE: snprintf(tmp, sizeof(tmp), "%lluB", (unsigned long long)*(const uint64_t *)field); break;
        case OPT_BOOL: val = *(const bool *)field ? "true" : "false"; break;
        }
        buf_printf(out, "%s: ", o->name);
        buf_put_json_string(out, val, strlen(val)); /* a JSON string is a valid YAML scalar */
        buf_putc(out, '\n');
    }
}

void config_format_flags_json(const config_t *c, buf_t *out)
{
    buf_putc(out, '{');
    for (size_t i = 0; i < CONFIG_NOPTS; i++) {
        const config_option_t *o = &config_options[i];
        const void *field = (const char *)c + o->offset;
        char tmp[64];
        const char *val = tmp;
        switch (o->kind) {
        case OPT_STRING:
        case OPT_LIST: val = *(char *const *)field ? *(char *const *)field : ""; break;
        case OPT_INT: snprintf(tmp, sizeof(tmp), "%lld", (long long)*(const int64_t *)field); break;
        case OPT_DURATION: format_duration_ms(*(const int64_t *)field, tmp, sizeof(tmp)); break;
        case OPT_SIZE: snprintf(tmp, sizeof(tmp), "%lluB", (unsigned long long)*(const uint64_t *)field); break;
        case OPT_BOOL: val = *(const bool *)field ? "true" : "false"; break;
        }
        if (i)
            buf_putc(out, ',');
        buf_put_json_string(out, o->name, strlen(o->name));
        buf_putc(out, ':');
        buf_put_json_string(out, val, strlen(val));
    }
    buf_putc(out, '}');
}

const char *config_list_next(const char *list, size_t *len)
{
    if (!list || !*list)
        return NULL;
    const char *nl = strchr(list, '\n');
    *len = nl ? (size_t)(nl - list) : strlen(list);
    return list;
}
