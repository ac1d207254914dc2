/*
 * sluice — the daemon's entry point: settings, logging, the data directory, the HTTP server and
 * its handlers, signals.
 *
 * Start-up order: parse settings (exit 2 on a bad flag or config file) → lock the data directory →
 * bind the listener (fail fast on a busy port) → register handlers and metrics → start workers
 * with /-/ready false → recover storage → ready. The main thread then only waits for signals:
 * SIGTERM/SIGINT stop accepting, finish in-flight requests (bounded by --web.shutdown-timeout),
 * flush, exit 0; SIGHUP reloads the config file's reloadable settings (log level and format), the
 * rule files and the expected-jobs file.
 */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/availability.h"
#include "api/control.h"
#include "api/flow.h"
#include "api/forward.h"
#include "api/push.h"
#include "api/remote.h"
#include "api/federate.h"
#include "api/query.h"
#include "api/router.h"
#include "api/rules.h"
#include "api/server.h"
#include "api/status.h"
#include "api/tsdb_status.h"
#include "api/ui.h"
#include "cmd/sluice/config.h"
#include "internal/remote/read_client.h"
#include "internal/remote/remote_querier.h"
#include "internal/util/arena.h"
#include "internal/util/buildinfo.h"
#include "internal/util/heap.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"
#include "storage/storage.h"

typedef struct {
    config_t *cfg;
    api_server_t *srv;
    api_status_t *status;
    api_rules_t *rules;
    struct event_base *base;
    int exit_code;
} main_ctx_t;

static int main_apply_logging(const config_t *c, char *err, size_t errlen)
{
    log_level_t lvl;
    log_format_t fmt;
    if (log_parse_level(c->log_level, &lvl) != 0) {
        snprintf(err, errlen, "invalid log level \"%s\"", c->log_level);
        return -1;
    }
    if (log_parse_format(c->log_format, &fmt) != 0) {
        snprintf(err, errlen, "invalid log format \"%s\"", c->log_format);
        return -1;
    }
    log_set_level(lvl);
    log_set_format(fmt);
    return 0;
}

/* mkdir -p */
static int main_mkdirs(const char *path, char *err, size_t errlen)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                goto fail;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        goto fail;
    return 0;
fail:
    snprintf(err, errlen, "cannot create data directory %.800s: %s", tmp, strerror(errno));
    return -1;
}

/* One daemon per data directory: a second one would corrupt the WAL. */
static int main_lock_data_dir(const char *path, char *err, size_t errlen)
{
    char lock[4096];
    snprintf(lock, sizeof(lock), "%s/lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %.800s: %s", lock, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen, "data directory %s is in use by another sluice process", path);
        close(fd);
        return -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
    if (ftruncate(fd, 0) == 0 && write(fd, pid, (size_t)n) < 0)
        log_debug("main", "cannot write pid to lock file");
    return fd; /* kept open (and locked) until exit */
}

static void main_http_metrics(void *ud, buf_t *out)
{
    api_server_write_metrics(ud, out);
}
static void main_storage_metrics(void *ud, buf_t *out)
{
    storage_write_metrics(ud, out);
}

static storage_t *main_storage_new(const config_t *c, char *err, size_t errlen)
{
    storage_options_t o;
    storage_options_default(&o);
    o.path = c->storage_path;
    o.retention_raw_ms = c->retention_raw_ms;
    o.wal_fsync_always = strcmp(c->wal_fsync, "always") == 0;
    o.wal_fsync_interval_ms = (uint32_t)c->wal_fsync_interval_ms;
    o.max_series = (uint64_t)c->max_series;
    o.max_series_per_request = (uint32_t)c->max_series_per_request;
    o.max_samples_per_request = (uint32_t)c->max_samples_per_request;
    o.max_future_ms = c->max_future_ms;
    o.rollups = c->rollups;
    o.snapshot_interval_ms = c->snapshot_interval_ms;
    return storage_new(&o, err, errlen);
}
static void main_process_metrics(void *ud, buf_t *out)
{
    (void)ud;
    metrics_write_process(out);
    buf_printf(out,
               "# HELP sluice_build_info A metric with a constant '1' value labeled by version, revision and branch.\n"
               "# TYPE sluice_build_info gauge\nsluice_build_info{branch=\"%s\",revision=\"%s\",version=\"%s\"} 1\n",
               SLUICE_BRANCH, SLUICE_REVISION, SLUICE_VERSION);
}

/* Every MAIN_HEAP_TRIM_INTERVAL_S the main thread (otherwise idle, waiting for signals) gives freed
 * heap memory back if RSS grew since it last did: without it RSS tracks the largest transient work
 * ever done (see heap.h).
 * Idle arena blocks (not taken since the last tick) go first. Not sooner: a 2 s release saved
 * 1-3 MiB in the push bench, but a dashboard refreshing every 10 s would then take its ~85 MiB
 * of blocks as fresh pages (page faults, ~70 us per page on the shared VM) on every refresh. */
#define MAIN_HEAP_TRIM_INTERVAL_S 10

static void main_on_heap_timer(evutil_socket_t fd, short what, void *arg)
{
    /* idle arena blocks first: the trim can then give those pages back */
    int64_t freed = heap_trim_tick(arena_cache_release_idle());
    if (freed > 64 << 20)
        log_debug("main", "returned freed heap memory", LF_I("bytes", freed));
}

static void main_on_stop_signal(evutil_socket_t sig, short what, void *arg)
{
    main_ctx_t *m = arg;
    log_info("main", "received signal, shutting down", LF_S("signal", sig == SIGINT ? "SIGINT" : "SIGTERM"));
    event_base_loopbreak(m->base);
}

static void main_on_reload_signal(evutil_socket_t sig, short what, void *arg)
{
    main_ctx_t *m = arg;
    buf_t rule_errs = BUF_INIT; /* rule files and closed-loop actions; failures keep the old ones */
    if (api_rules_reload(m->rules, &rule_errs) == 0)
        log_info("main", "SIGHUP: rules reloaded");
    buf_free(&rule_errs);
    if (m->cfg->web_config_file && m->cfg->web_config_file[0]) {
        char werr[1024];
        if (api_server_reload_web_config(m->srv, werr, sizeof(werr)) == 0)
            log_info("main", "SIGHUP: web config reloaded", LF_S("file", m->cfg->web_config_file));
        else
            log_error("main", "web config reload failed; keeping the running one", LF_S("err", werr));
    }
    if (!m->cfg->config_file || !m->cfg->config_file[0]) {
        log_info("main", "SIGHUP: no --config.file to reload");
        api_status_note_config_load(m->status, true);
        return;
    }
    config_t fresh;
    char err[512];
    config_init(&fresh);
    if (config_load_file(&fresh, m->cfg->config_file, err, sizeof(err)) != 0 ||
        main_apply_logging(&fresh, err, sizeof(err)) != 0) {
        log_error("main", "config reload failed; keeping the running configuration", LF_S("err", err));
        api_status_note_config_load(m->status, false);
        config_free(&fresh);
        return;
    }
    log_info("main", "configuration reloaded", LF_S("file", m->cfg->config_file), LF_S("log_level", fresh.log_level));
    api_status_note_config_load(m->status, true);
    config_free(&fresh);
}

/* --remote-read.*: the remote stores PromQL falls through to (storage_set_fallthrough). */
typedef struct {
    remote_read_client_t **clients;
    size_t n;
    bool fail;
    label_t *external; /* --external-label pairs, stripped from what the remotes return */
    size_t nexternal;
    char *external_strs;
} main_remote_read_t;

static querier_t *main_open_remote(void *ud)
{
    main_remote_read_t *rr = ud;
    remote_querier_opts_t o = {.clients = rr->clients,
                               .nclients = rr->n,
                               .fail_on_error = rr->fail,
                               .external = rr->external,
                               .nexternal = rr->nexternal};
    return remote_querier_new(&o);
}

static void main_remote_read_free(main_remote_read_t *rr)
{
    for (size_t i = 0; i < rr->n; i++)
        remote_read_client_free(rr->clients[i]);
    free(rr->clients);
    free(rr->external);
    free(rr->external_strs);
    rr->clients = NULL;
    rr->n = 0;
}

/* One client per --remote-read.url. 0, or -1 with a message (a bad spec stops start-up). */
static int main_remote_read_setup(const config_t *c, main_remote_read_t *rr, char *err, size_t errlen)
{
    rr->fail = strcmp(c->remote_read_on_error, "fail") == 0;
    size_t len;
    /* name=value pairs, checked by the remote-write sender's parser; here only split */
    rr->external_strs = strdup(c->external_labels ? c->external_labels : "");
    for (char *it = rr->external_strs; it && *it;) {
        char *nl = strchr(it, '\n'), *eq = strchr(it, '=');
        if (nl)
            *nl = 0;
        if (eq && eq != it) {
            *eq = 0;
            char *val = eq + 1;
            size_t vl = strlen(val);
            if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') { /* as the sender reads them */
                val[vl - 1] = 0;
                val++;
            }
            label_t *v = realloc(rr->external, (rr->nexternal + 1) * sizeof(*v));
            if (!v) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            rr->external = v;
            rr->external[rr->nexternal++] = (label_t){it, val};
        }
        it = nl ? nl + 1 : it + strlen(it);
    }
    /* defaults of https:// targets; a target's tls-*= options override them */
    const tls_client_options_t tls = {.ca_file = c->remote_read_tls_ca_file,
                                      .cert_file = c->remote_read_tls_cert_file,
                                      .key_file = c->remote_read_tls_key_file,
                                      .server_name = c->remote_read_tls_server_name,
                                      .insecure_skip_verify = c->remote_read_tls_insecure_skip_verify};
    for (const char *it = config_list_next(c->remote_read_urls, &len); it;
         it = it[len] == '\n' ? config_list_next(it + len + 1, &len) : NULL) {
        char *spec = strndup(it, len);
        remote_read_client_t **v = realloc(rr->clients, (rr->n + 1) * sizeof(*v));
        if (!spec || !v) {
            free(spec);
            if (v)
                rr->clients = v;
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        rr->clients = v;
        remote_read_client_opts_t o = {.spec = spec,
                                       .timeout_ms = c->remote_read_timeout_ms,
                                       .max_response_bytes = (size_t)c->remote_read_max_response_bytes,
                                       .max_samples = (uint64_t)c->query_max_samples,
                                       .tls = &tls};
        rr->clients[rr->n] = remote_read_client_new(&o, err, errlen);
        free(spec);
        if (!rr->clients[rr->n])
            return -1;
        rr->n++;
    }
    return 0;
}

/* --query.max-memory: what running queries and remote reads hold together (arena budgets). */
static arena_budget_t query_memory;

int main(int argc, char **argv)
{
    config_t cfg;
    char err[1024];
    config_init(&cfg);
    config_parse_result_t pr = config_parse_args(&cfg, argc, argv, err, sizeof(err));
    if (pr == CONFIG_PARSE_EXIT_OK) {
        config_free(&cfg);
        return 0;
    }
    if (pr == CONFIG_PARSE_ERROR || main_apply_logging(&cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "sluice: error: %s\n", err);
        config_free(&cfg);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit must be a write error (503), not a dead daemon */
    log_info("main", "starting sluice", LF_S("version", SLUICE_VERSION), LF_S("revision", SLUICE_REVISION));

    int rc = 1;
    int lock_fd = -1;
    api_server_t *srv = NULL;
    storage_t *storage = NULL;
    api_push_t *push = NULL;
    api_avail_t *avail = NULL;
    api_flow_t *flow = NULL;
    api_forward_t *forward = NULL;
    api_remote_t *remote = NULL;
    api_query_t *query = NULL;
    api_federate_t *federate = NULL;
    api_control_t *control = NULL;
    api_status_t *status = NULL;
    api_rules_t *rules = NULL;
    buf_t config_yaml = BUF_INIT;
    struct event_base *base = NULL;
    buf_t flags = BUF_INIT;
    main_remote_read_t remote_read = {0};

    if (main_mkdirs(cfg.storage_path, err, sizeof(err)) != 0 ||
        (lock_fd = main_lock_data_dir(cfg.storage_path, err, sizeof(err))) < 0) {
        log_error("main", "cannot use the data directory", LF_S("err", err));
        goto out;
    }

    api_server_options_t so = {
        .listen_address = cfg.listen_address,
        .workers = (int)cfg.workers,
        .max_connections = cfg.max_connections,
        .max_body_bytes = cfg.max_body_bytes,
        .max_header_bytes = cfg.max_header_bytes,
        .read_timeout_ms = cfg.read_timeout_ms,
        .web_config_file = cfg.web_config_file,
    };
    srv = api_server_create(&so, err, sizeof(err));
    if (!srv) {
        log_error("main", "cannot listen", LF_S("err", err));
        goto out;
    }

    storage = main_storage_new(&cfg, err, sizeof(err));
    if (!storage) {
        log_error("main", "cannot set up storage", LF_S("err", err));
        goto out;
    }

    if (main_remote_read_setup(&cfg, &remote_read, err, sizeof(err)) != 0) {
        log_error("main", "bad remote-read settings", LF_S("err", err));
        goto out;
    }
    if (remote_read.n) {
        storage_fallthrough_t ft = {.open = main_open_remote, .ud = &remote_read, .read_recent = cfg.remote_read_recent};
        storage_set_fallthrough(storage, &ft);
        for (size_t i = 0; i < remote_read.n; i++)
            log_info("main", "PromQL falls through to remote read",
                     LF_S("remote_name", remote_read_client_name(remote_read.clients[i])),
                     LF_S("url", remote_read_client_url(remote_read.clients[i])),
                     LF_S("read_recent", cfg.remote_read_recent ? "true" : "false"),
                     LF_S("on_error", cfg.remote_read_on_error));
    }

    config_format_flags_json(&cfg, &flags);
    api_status_options_t sto = {
        .flags_json = flags.data, .storage_path = cfg.storage_path, .retention_raw_ms = cfg.retention_raw_ms};
    status = api_status_new(&sto);
    if (!status) {
        log_error("main", "out of memory");
        goto out;
    }
    api_status_register_routes(status, srv);
    api_tsdb_status_register_routes(storage, srv);
    config_format_yaml(&cfg, &config_yaml);
    query_memory.limit = (size_t)cfg.query_max_memory;
    api_query_options_t qo = {.srv = srv,
                              .storage = storage,
                              .lookback_ms = cfg.query_lookback_ms,
                              .timeout_ms = cfg.query_timeout_ms,
                              .max_samples = cfg.query_max_samples,
                              .max_concurrency = (int)cfg.query_max_concurrency,
                              .max_memory = (size_t)cfg.query_max_memory_per_query,
                              .budget = &query_memory,
                              .config_yaml = config_yaml.data};
    query = api_query_new(&qo, err, sizeof(err));
    if (!query) {
        log_error("main", "cannot start the query engine", LF_S("err", err));
        goto out;
    }
    api_query_register_routes(query, srv);
    api_avail_options_t avo = {.storage = storage,
                               .storage_path = cfg.storage_path,
                               .expected_file = cfg.control_expected_jobs_file,
                               .default_interval_ms = cfg.push_expected_interval_ms,
                               .missing_intervals = (uint32_t)cfg.push_missing_intervals,
                               .series_interval_ms = cfg.push_heartbeat_series_interval_ms};
    avail = api_avail_new(&avo, err, sizeof(err));
    if (!avail) {
        log_error("main", "cannot start availability accounting", LF_S("err", err));
        goto out;
    }
    api_federate_options_t fdo = {.srv = srv,
                                  .storage = storage,
                                  .lookback_ms = cfg.query_lookback_ms,
                                  .timeout_ms = cfg.query_timeout_ms,
                                  .max_series = cfg.query_max_samples,
                                  .max_memory = (size_t)cfg.query_max_memory_per_query,
                                  .budget = &query_memory,
                                  .external_labels = cfg.external_labels};
    federate = api_federate_new(&fdo, err, sizeof(err));
    if (!federate) {
        log_error("main", "cannot start federation", LF_S("err", err));
        goto out;
    }
    api_federate_register_routes(federate, srv);
    api_push_options_t po = {
        .storage = storage,
        .limits = {.max_samples = (size_t)cfg.max_samples_per_request},
        .max_decoded_bytes = cfg.max_body_bytes,
        .group_ttl_ms = cfg.push_group_ttl_ms,
        .missed_intervals = (uint32_t)cfg.push_missed_intervals,
        .enable_admin_api = cfg.enable_admin_api,
        .flags_json = flags.data,
        .on_beat = api_avail_on_beat,
        .beat_ud = avail,
    };
    push = api_push_new(&po);
    if (!push) {
        log_error("main", "out of memory");
        goto out;
    }
    api_push_register_routes(push, srv); /* pushed groups come first in /metrics, as in a Pushgateway */
    api_remote_options_t rmo = {.storage = storage,
                                .max_decoded_bytes = cfg.max_body_bytes,
                                .read_sample_limit = (uint64_t)cfg.remote_read_sample_limit,
                                .read_max_bytes_in_frame = (size_t)cfg.remote_read_max_bytes_in_frame,
                                .read_timeout_ms = cfg.query_timeout_ms,
                                .read_max_memory = (size_t)cfg.query_max_memory_per_query,
                                .read_budget = &query_memory};
    remote = api_remote_new(&rmo);
    if (!remote) {
        log_error("main", "out of memory");
        goto out;
    }
    api_remote_register_routes(remote, srv);
    api_control_options_t cto = {.srv = srv,
                                 .storage_path = cfg.storage_path,
                                 .token_file = cfg.control_token_file,
                                 .read_auth = cfg.control_read_auth};
    control = api_control_new(&cto, err, sizeof(err));
    if (!control) {
        log_error("main", "cannot start flow control", LF_S("err", err));
        goto out;
    }
    api_control_register_routes(control, srv);
    api_avail_register_routes(avail, srv, control);
    api_rules_options_t ruo = {.srv = srv,
                               .storage = storage,
                               .control = control,
                               .rule_files = cfg.rules_files,
                               .alertmanager_urls = cfg.alertmanager_urls,
                               .external_labels = cfg.rules_external_labels,
                               .external_url = cfg.external_url,
                               .config_file = cfg.config_file,
                               .eval_interval_ms = cfg.rules_eval_interval_ms,
                               .resend_delay_ms = cfg.rules_resend_delay_ms,
                               .for_grace_ms = cfg.rules_for_grace_ms,
                               .outage_tolerance_ms = cfg.rules_outage_tolerance_ms,
                               .lookback_ms = cfg.query_lookback_ms,
                               .query_timeout_ms = cfg.query_timeout_ms,
                               .max_samples = cfg.query_max_samples,
                               .max_memory = (size_t)cfg.query_max_memory_per_query,
                               .am_queue_capacity = cfg.alertmanager_queue_capacity,
                               .am_timeout_ms = cfg.alertmanager_timeout_ms,
                               .also_reload = api_avail_reload,
                               .also_reload_ud = avail};
    rules = api_rules_new(&ruo, err, sizeof(err));
    if (!rules) {
        log_error("main", "cannot load rules", LF_S("err", err));
        goto out;
    }
    api_rules_register_routes(rules, srv);
    api_flow_options_t fo = {
        .storage = storage, .srv = srv, .control_json = api_control_state_json, .control_ud = control};
    flow = api_flow_new(&fo);
    if (!flow) {
        log_error("main", "out of memory");
        goto out;
    }
    api_flow_register_routes(flow, srv);
    api_ui_register_routes(srv); /* the dashboard at / */
    metrics_register("process", main_process_metrics, NULL);
    metrics_register("heap", heap_write_metrics, NULL);
    metrics_register("http", main_http_metrics, srv);
    metrics_register("storage", main_storage_metrics, storage);
    /* Remote-write sender: before recovery, so its WAL hold protects unsent segments from the first
     * snapshot on. */
    api_forward_options_t fwo = {.storage = storage,
                                 .data_dir = cfg.storage_path,
                                 .targets = cfg.remote_write_urls,
                                 .external_labels = cfg.external_labels,
                                 .shards = (uint32_t)cfg.remote_write_shards,
                                 .max_samples_per_send = (uint32_t)cfg.remote_write_max_samples_per_send,
                                 .timeout_ms = cfg.remote_write_timeout_ms,
                                 .min_backoff_ms = cfg.remote_write_min_backoff_ms,
                                 .max_backoff_ms = cfg.remote_write_max_backoff_ms,
                                 .retry_on_429 = cfg.remote_write_retry_on_429,
                                 .wal_max_hold_ms = cfg.remote_write_wal_max_hold_ms,
                                 .tls = {.ca_file = cfg.remote_write_tls_ca_file,
                                         .cert_file = cfg.remote_write_tls_cert_file,
                                         .key_file = cfg.remote_write_tls_key_file,
                                         .server_name = cfg.remote_write_tls_server_name,
                                         .insecure_skip_verify = cfg.remote_write_tls_insecure_skip_verify}};
    forward = api_forward_new(&fwo, err, sizeof(err));
    if (!forward && err[0]) {
        log_error("main", "bad remote-write settings", LF_S("err", err));
        goto out;
    }
    if (forward)
        metrics_register("remote_write", api_forward_write_metrics, forward);

    if (api_server_start(srv, err, sizeof(err)) != 0) {
        log_error("main", "cannot start the HTTP server", LF_S("err", err));
        goto out;
    }
    log_info("main", "listening", LF_S("address", cfg.listen_address), LF_I("port", api_server_port(srv)),
             LF_S("tls", api_server_tls(srv) ? "true" : "false"),
             LF_I("workers", api_server_worker_count(srv)), LF_S("storage_path", cfg.storage_path));

    /* Until recovery is done /-/ready answers 503 (the server is up so health checks see why). */
    if (storage_recover(storage, err, sizeof(err)) != 0) {
        log_error("main", "storage recovery failed", LF_S("err", err));
        api_server_stop(srv, 0);
        goto out;
    }
    if (forward && api_forward_start(forward, err, sizeof(err)) != 0) {
        log_error("main", "cannot start remote write", LF_S("err", err));
        goto out;
    }
    if (api_push_start(push) != 0) {
        log_error("main", "cannot start push group expiry");
        goto out;
    }
    if (api_avail_start(avail) != 0) {
        log_error("main", "cannot start availability accounting");
        goto out;
    }
    base = event_base_new();
    main_ctx_t m = {.cfg = &cfg, .srv = srv, .status = status, .rules = rules, .base = base};
    struct event *ev_term = evsignal_new(base, SIGTERM, main_on_stop_signal, &m);
    struct event *ev_int = evsignal_new(base, SIGINT, main_on_stop_signal, &m);
    struct event *ev_hup = evsignal_new(base, SIGHUP, main_on_reload_signal, &m);
    event_add(ev_term, NULL);
    event_add(ev_int, NULL);
    event_add(ev_hup, NULL);
    struct event *ev_heap = event_new(base, -1, EV_PERSIST, main_on_heap_timer, NULL);
    event_add(ev_heap, &(struct timeval){.tv_sec = MAIN_HEAP_TRIM_INTERVAL_S});
    /* Ready only once SIGTERM is handled: a client that stops us right away gets a clean exit. */
    api_rules_start(rules);
    api_status_set_ready(status, true);
    log_info("main", "server is ready to receive requests");
    event_base_dispatch(base);

    api_status_set_ready(status, false);
    api_server_stop(srv, cfg.shutdown_timeout_ms);
    api_rules_shutdown(rules); /* before storage closes; its closed loop waits on the control thread */
    api_push_stop(push);
    api_avail_stop(avail); /* closes open gaps as "sluice stopped" */
    api_forward_stop(forward); /* saves positions; the final snapshot keeps what is unsent */
    storage_close(storage);    /* final snapshot: a clean restart loses nothing */
    storage = NULL;
    event_free(ev_term);
    event_free(ev_int);
    event_free(ev_hup);
    event_free(ev_heap);
    log_info("main", "shutdown complete");
    rc = 0;
out:
    api_rules_shutdown(rules);
    api_control_shutdown(control); /* before the workers' loops are freed: the control thread posts to them */
    api_query_free(query);         /* after the server stopped: no query is queued any more */
    api_federate_free(federate);   /* likewise */
    api_flow_free(flow);           /* after the server stopped: its shutdown hook ended the streams */
    api_server_destroy(srv);
    api_rules_free(rules); /* after the server: its routes point at the handles */
    api_control_free(control);
    api_status_free(status);
    api_push_free(push);
    api_avail_free(avail); /* after push: the registry's hook points at it */
    api_remote_free(remote);
    api_forward_stop(forward);
    storage_close(storage);
    api_forward_free(forward); /* after storage_close: the final snapshot asked its WAL hold */
    main_remote_read_free(&remote_read); /* after the queries that used it ended */
    if (base)
        event_base_free(base);
    metrics_unregister_all();
    buf_free(&flags);
    buf_free(&config_yaml);
    if (lock_fd >= 0)
        close(lock_fd);
    config_free(&cfg);
    return rc;
}
