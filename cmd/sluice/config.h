/*
 * config — every setting of the daemon, from three layers: embedded defaults < YAML config file
 * (--config.file) < command-line flags. Flags are Prometheus style (`--web.listen-address=:9091`
 * or `--web.listen-address :9091`; booleans `--flag`, `--no-flag`, `--flag=false`). The config file
 * uses the same names, either flat (`web.listen-address: ":9091"`) or nested (`web:
 * {listen-address: ":9091"}`). Settings are described once, in a table in config.c: adding a
 * setting is one line there plus the field here.
 */
#ifndef SLUICE_CMD_CONFIG_H
#define SLUICE_CMD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "internal/util/buf.h"

typedef struct {
    /* web */
    char *listen_address;
    int64_t workers;
    int64_t max_connections;
    uint64_t max_body_bytes;
    uint64_t max_header_bytes;
    int64_t read_timeout_ms;
    int64_t shutdown_timeout_ms;
    bool enable_admin_api;
    char *control_token_file; /* "" = none */
    bool control_read_auth;
    /* storage */
    char *storage_path;
    int64_t retention_raw_ms;
    int64_t max_series;
    int64_t max_series_per_request;
    int64_t max_future_ms;
    int64_t max_samples_per_request;
    char *wal_fsync; /* "interval" | "always" */
    int64_t wal_fsync_interval_ms;
    int64_t snapshot_interval_ms;
    char *rollups; /* "1m:15d,1h:400d" */
    /* query */
    int64_t query_lookback_ms;
    int64_t query_timeout_ms;
    int64_t query_max_samples;
    int64_t query_max_concurrency;
    uint64_t query_max_memory_per_query, query_max_memory;
    /* remote read */
    int64_t remote_read_sample_limit;
    uint64_t remote_read_max_bytes_in_frame;
    /* push gateway */
    int64_t push_group_ttl_ms;
    int64_t push_missed_intervals;
    /* availability from heartbeats, expected jobs (api/availability.h) */
    int64_t push_expected_interval_ms;       /* 0 = learned */
    int64_t push_missing_intervals;
    int64_t push_heartbeat_series_interval_ms;
    char *control_expected_jobs_file; /* "" = none */
    /* rules and alerting */
    char *rules_files; /* repeatable: '\n'-joined */
    int64_t rules_eval_interval_ms;
    char *rules_external_labels;
    int64_t rules_resend_delay_ms;
    int64_t rules_for_grace_ms;
    int64_t rules_outage_tolerance_ms;
    char *external_url;
    char *alertmanager_urls; /* repeatable: '\n'-joined */
    int64_t alertmanager_queue_capacity;
    int64_t alertmanager_timeout_ms;
    /* remote write sender (api/forward) */
    char *remote_write_urls; /* repeatable: '\n'-joined "URL [key=value ...]" */
    char *external_labels;   /* repeatable: '\n'-joined name=value */
    int64_t remote_write_shards;
    int64_t remote_write_max_samples_per_send;
    int64_t remote_write_timeout_ms;
    int64_t remote_write_min_backoff_ms;
    int64_t remote_write_max_backoff_ms;
    bool remote_write_retry_on_429;
    int64_t remote_write_wal_max_hold_ms;
    char *remote_write_tls_ca_file; /* "" = system store */
    char *remote_write_tls_cert_file;
    char *remote_write_tls_key_file;
    char *remote_write_tls_server_name;
    bool remote_write_tls_insecure_skip_verify;
    char *web_config_file; /* --web.config.file, "" = plain HTTP, no auth */
    /* remote read fall-through (internal/remote, storage/querier_fallthrough) */
    char *remote_read_urls; /* repeatable: '\n'-joined "URL [key=value ...]" */
    bool remote_read_recent;
    int64_t remote_read_timeout_ms;
    char *remote_read_on_error; /* "warn" | "fail" */
    uint64_t remote_read_max_response_bytes;
    char *remote_read_tls_ca_file; /* "" = system store */
    char *remote_read_tls_cert_file;
    char *remote_read_tls_key_file;
    char *remote_read_tls_server_name;
    bool remote_read_tls_insecure_skip_verify;
    /* logging */
    char *log_level;
    char *log_format;
    /* the file the rest came from, if any */
    char *config_file;
} config_t;

typedef enum { CONFIG_PARSE_OK = 0, CONFIG_PARSE_EXIT_OK = 1, CONFIG_PARSE_ERROR = -1 } config_parse_result_t;

/* Fills defaults. Strings in config_t are owned by it; release with config_free. */
void config_init(config_t *c);
void config_free(config_t *c);
/* Applies argv (and the config file it names). Returns CONFIG_PARSE_EXIT_OK after printing
 * --help or --version to out, CONFIG_PARSE_ERROR with a one-line message in err. */
config_parse_result_t config_parse_args(config_t *c, int argc, char **argv, char *err, size_t errlen);
/* Applies a YAML config file over c. 0 or -1 with err. */
int config_load_file(config_t *c, const char *path, char *err, size_t errlen);
/* Checks cross-setting rules (e.g. log level names) after everything is applied. */
int config_validate(const config_t *c, char *err, size_t errlen);
/* Iterates a repeatable flag's value: returns the first item (length in *len) of list, or NULL
 * when empty; the next item starts at ret + *len + 1 when list[*len] == '\n'. */
const char *config_list_next(const char *list, size_t *len);
/* Writes --help text. */
void config_print_help(const char *prog, FILE *out);
/* Appends {"flag.name":"value",...} (Prometheus /api/v1/status/flags shape, values as strings). */
void config_format_flags_json(const config_t *c, buf_t *out);
/* Appends the effective settings as YAML ("name: value" lines; /api/v1/status/config). */
void config_format_yaml(const config_t *c, buf_t *out);

#endif
