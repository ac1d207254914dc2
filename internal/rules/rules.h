/*
 * rules — the rule manager: groups of recording and alerting rules loaded from Prometheus rule
 * files (rulefile.h), evaluated on one background thread the way Prometheus 2.42 evaluates them,
 * with their results written into storage and their alerts handed to hooks (the Alertmanager
 * notifier, closed-loop flow-control actions).
 *
 * Timing (as Prometheus' Group.EvalTimestamp): a group's evaluations happen at
 *     t = base + offset,   offset = xxhash64(labels{file=<file>, name=<group>}) mod interval
 * (nanoseconds), base a multiple of the interval, so a group with the same file path, name and
 * interval is evaluated at the same instants by sluice and by Prometheus. The first evaluation is
 * the first such instant after the group was loaded; missed instants are skipped and counted.
 *
 * Alert state machine (one per alert = per label set an alerting rule's query returns):
 *
 *                 in result                 for elapsed
 *   (absent) ---------------> PENDING ------------------> FIRING
 *       ^                        |                          |   not in result (and keep_firing_for
 *       |   not in result        |                          |   elapsed)
 *       +------------------------+                          v
 *       +------ 15 min later (resolvedRetention) ------- INACTIVE (resolved; resolved_at set)
 *                                                           |  in result again: new PENDING
 *
 *   transitions and where they happen: rl_eval_alerting() does every one of them at an
 *   evaluation time ts; rl_alert_check() asserts the invariants (PENDING/FIRING have no
 *   resolved_at, FIRING has fired_at >= active_at, INACTIVE has resolved_at).
 *
 * Series written at each evaluation ts: recording rules' results (metric renamed, rule labels
 * applied); for each pending/firing alert ALERTS{<alert labels>, alertstate="pending"|"firing"} 1
 * and ALERTS_FOR_STATE{<alert labels>} <active_at in unix seconds>; a staleness marker for every
 * series a rule wrote at its previous evaluation but not at this one. As in Prometheus, alert
 * series are written only once the rule is "restored": at start-up, after the group's second
 * evaluation, pending alerts with for >= --rules.alert.for-grace-period take their active time
 * back from ALERTS_FOR_STATE (so a restart does not reset `for`); rules loaded by a reload are
 * restored at once.
 *
 * Reload: rules_manager_load parses and checks every file first; on any error nothing changes
 * (the old rules keep running) and the errors are returned. Otherwise the new groups replace the
 * old ones between two group evaluations; a group with the same file and name keeps its alerts'
 * state (rules matched by name and labels, as Prometheus' CopyState); series of removed rules
 * get staleness markers.
 *
 * Thread safety: all functions are thread-safe. Hooks run on the evaluation thread, outside the
 * manager's lock, and must not call back into the manager's load/free.
 */
#ifndef SLUICE_RULES_RULES_H
#define SLUICE_RULES_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/util/buf.h"
#include "storage/storage.h"

typedef struct rules_manager rules_manager_t;

/* One alert as the hooks see it (valid during the hook call only). */
typedef struct {
    const char *alertname;
    const char *group;
    const labels_t *labels; /* alertname included; external labels not */
    const labels_t *annotations;
    double value;
    int64_t active_at_ms;
    int64_t starts_at_ms; /* fired_at */
    int64_t ends_at_ms;   /* resolved_at, or valid_until while firing */
    bool resolved;
    const char *generator_url;
} rules_alert_note_t;

typedef struct {
    void *ud;
    /* After an alerting rule's evaluation: the alerts Prometheus would send to Alertmanager now
     * (firing ones every resend delay, resolved ones once plus resends). May be NULL. */
    void (*send)(void *ud, const rules_alert_note_t *alerts, size_t n);
    /* An alert became firing (firing = true) or was resolved (false) at ts_ms. May be NULL. */
    void (*transition)(void *ud, const rules_alert_note_t *a, bool firing, int64_t ts_ms);
} rules_hooks_t;

typedef struct {
    storage_t *storage;
    int64_t default_interval_ms;                        /* 0 = 1m (Prometheus' global evaluation_interval) */
    const labels_t *external_labels;                    /* copied; for templates ($externalLabels) */
    const char *external_url;                           /* copied; for templates and generatorURL; NULL = "" */
    int64_t lookback_ms, query_timeout_ms, max_samples; /* PromQL options; 0 = defaults */
    size_t max_memory;       /* per evaluation (promql_opts_t.max_memory); rules are not charged to the shared budget */
    int64_t resend_delay_ms; /* 0 = 1m */
    int64_t outage_tolerance_ms; /* 0 = 1h */
    int64_t for_grace_period_ms; /* 0 = 10m */
    rules_hooks_t hooks;
} rules_options_t;

rules_manager_t *rules_manager_new(const rules_options_t *o);
/* Loads or reloads: all files or nothing. Returns 0, or the number of errors (one line each,
 * promtool style, appended to errs). The patterns are remembered for rules_manager_reload. */
int rules_manager_load(rules_manager_t *m, const char *const *patterns, size_t n, buf_t *errs);
/* Loads the remembered patterns again (SIGHUP, POST /-/reload). */
int rules_manager_reload(rules_manager_t *m, buf_t *errs);
/* Starts the evaluation thread. 0 or -1. */
int rules_manager_start(rules_manager_t *m);
/* Stops the thread (if started) and frees everything. m may be NULL. */
void rules_manager_free(rules_manager_t *m);

/* Tests and tools, without the thread: evaluates every group once at ts_ms, in order. */
void rules_manager_eval_all_at(rules_manager_t *m, int64_t ts_ms);
/* Number of groups loaded. */
size_t rules_manager_group_count(rules_manager_t *m);

/* GET /api/v1/rules data: {"groups":[...]} in Prometheus 2.42's shape. type_filter: NULL, "alert"
 * or "record". */
void rules_manager_rules_json(rules_manager_t *m, const char *type_filter, buf_t *out);
/* GET /api/v1/alerts data: {"alerts":[...]} (pending and firing alerts). */
void rules_manager_alerts_json(rules_manager_t *m, buf_t *out);
/* sluice_rule_* self-metrics, text format. */
void rules_manager_write_metrics(rules_manager_t *m, buf_t *out);
/* Whether the last load/reload succeeded, and when (for prometheus_config_last_reload_* style
 * metrics and logs). */
bool rules_manager_last_reload_ok(rules_manager_t *m);

/* Prometheus' Group.EvalTimestamp: the latest aligned evaluation instant <= now_ns. */
int64_t rules_group_eval_timestamp_ns(const char *name, const char *file, int64_t interval_ms, int64_t now_ns);
/* RFC 3339 with up to nanosecond digits, trailing zeros trimmed, "Z" (Go's time.Time JSON). A
 * zero time renders "0001-01-01T00:00:00Z". */
void rules_format_time(int64_t ms, buf_t *out);

#endif
