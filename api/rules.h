/*
 * api/rules — the rules' HTTP surface, in Prometheus' shapes:
 *   GET  /api/v1/rules[?type=alert|record]  {"status":"success","data":{"groups":[...]}}
 *   GET  /api/v1/alerts                     {"status":"success","data":{"alerts":[...]}}
 *   POST|PUT /-/reload                      re-reads the rule files (and the closed-loop actions);
 *                                           200 on success, 500 "failed to reload config: ..." with
 *                                           the old rules still running otherwise
 * The reload runs on a short-lived thread (it parses files and waits for the evaluator to finish
 * its current group), and the parked request is answered on its worker afterwards.
 *
 * It also wires the rules subsystem into the daemon: rule manager, Alertmanager notifier and
 * closed-loop actions (through api/control's internal entry point).
 */
#ifndef SLUICE_API_RULES_H
#define SLUICE_API_RULES_H

#include <stdbool.h>

#include "api/control.h"
#include "api/server.h"
#include "internal/rules/rules.h"
#include "internal/util/buf.h"
#include "storage/storage.h"

typedef struct {
    api_server_t *srv; /* created (its port known), not necessarily started */
    storage_t *storage;
    api_control_t *control;        /* the closed loop's actions read and change flow control through it */
    const char *rule_files;        /* patterns, '\n'-separated ("" = none) */
    const char *alertmanager_urls; /* '\n'-separated ("" = no notifications) */
    const char *external_labels;   /* "name=value,name=value" */
    const char *external_url;      /* "" = http://<hostname>:<port> */
    const char *config_file;       /* the `actions:` of the closed loop; NULL/"" = none */
    int64_t eval_interval_ms, resend_delay_ms, for_grace_ms, outage_tolerance_ms;
    int64_t lookback_ms, query_timeout_ms, max_samples;
    size_t max_memory; /* per evaluation */
    int64_t am_queue_capacity, am_timeout_ms;
    /* Something else SIGHUP and POST /-/reload re-read (the expected-jobs file), or NULL: 0 or
     * the number of errors appended to errs (one per line). */
    int (*also_reload)(void *ud, buf_t *errs);
    void *also_reload_ud;
} api_rules_options_t;

typedef struct api_rules api_rules_t;

/* Builds the rule manager, notifier and closed-loop actions and loads the rule files (an invalid
 * file fails start-up, as in Prometheus). Call after api_control_new and before
 * api_server_start. NULL + err. */
api_rules_t *api_rules_new(const api_rules_options_t *o, char *err, size_t errlen);
/* The routes above and the rules' metrics collector. */
void api_rules_register_routes(api_rules_t *ar, api_server_t *srv);
/* Starts evaluating (call once storage is ready). */
void api_rules_start(api_rules_t *ar);
/* SIGHUP / POST /-/reload: rule files and actions. 0 or the number of errors (appended to errs). */
int api_rules_reload(api_rules_t *ar, buf_t *errs);
/* Stops evaluation and notification (a reload after it does nothing). Call after api_server_stop
 * and before api_control_shutdown and storage_close; idempotent, NULL is fine. */
void api_rules_shutdown(api_rules_t *ar);
/* Shuts down if not yet done and frees the handle; after the server is destroyed. */
void api_rules_free(api_rules_t *ar);

#endif
