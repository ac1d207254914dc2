/*
 * rules/actions — the closed loop: an alert that starts firing changes the flow-control state of
 * the Flink job it names (pause, rate limit, drain), and its resolution undoes the change.
 *
 * Bindings live in sluice's own config file (--config.file), under `actions:`, so rule files
 * stay exactly what Prometheus loads:
 *
 *   actions:
 *   - alert: FlinkJobBackpressured   # alert name (required)
 *     action: pause                  # pause | rate_limit | drain (required)
 *     job_label: job_name            # the alert label naming the job (default job_name)
 *     rate_limit: 5000               # rate_limit: fixed records/s, or
 *     rate_limit_fraction: 0.5       #   a fraction of the job's recent input rate, read with
 *     input_rate_query: 'sum(flink_taskmanager_job_task_operator_numRecordsOutPerSecond{job_name="$job",operator_name=~"Source:.*"})'
 *                                    #   ($job is replaced by the job name; this is the default:
 *                                    #   the records/s the job's source operators read)
 *     drain:                         # drain: matchers (none = drop everything)
 *     - {attribute: table, regex: "^tmp_"}
 *     revert: on_resolve             # on_resolve (default) or a duration ("10m": the control
 *                                    # store's expiry brings the previous state back)
 *     cooldown: 5m                   # after a revert, the same alert+job is left alone this long
 *     max_active: 3                  # at most this many jobs changed by this binding at once
 *     dry_run: false                 # true: only log what would be done
 *
 * Safety rules (an operator always wins):
 *   - a binding acts only on a job that is RUNNING (a job paused, limited or draining by anyone
 *     is left alone), through the control API's own path (same store, audit log and fan-out to
 *     long-polls), with updated_by "rule:<alert>" and optimistic concurrency on the version;
 *   - on resolve it restores the previous state only if the job's version is still the one its
 *     own change produced: any change made meanwhile (manual or not) wins and is kept;
 *   - after a restart, a job left in a state set by "rule:<alert>" is adopted when that alert
 *     fires again, so its resolution still restores RUNNING.
 *
 * Thread safety: all functions are thread-safe; transitions arrive on the rules thread.
 */
#ifndef SLUICE_RULES_ACTIONS_H
#define SLUICE_RULES_ACTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "internal/control/control.h"
#include "internal/rules/rules.h"
#include "internal/util/buf.h"
#include "storage/storage.h"

typedef struct rules_actions rules_actions_t;

/* How actions reach flow control (the daemon wires these to api/control). */
typedef struct {
    void *ud;
    /* The job's current state (RUNNING at version 0 if never changed). 0 or -1. */
    int (*get)(void *ud, const char *job, control_state_t *out);
    /* Applies chg as updated_by. 0 with the new version in *version; 1 when chg->check_version
     * did not match (someone changed the job meanwhile); -1 + err on failure. */
    int (*apply)(void *ud, const char *job, const control_change_t *chg, const char *updated_by, uint64_t *version,
                 char *err, size_t errlen);
} rules_control_ops_t;

/* Reads the bindings from a config file's `actions:` (none if path is NULL/"" or the key is
 * absent). storage is used for rate_limit_fraction's input-rate query. NULL + err (naming the
 * line) on a bad binding. */
rules_actions_t *rules_actions_new(const char *config_path, storage_t *storage, const rules_control_ops_t *ops,
                                   char *err, size_t errlen);
/* Re-reads the bindings (SIGHUP); on error the old ones stay. Jobs changed by the old bindings
 * stay tracked and are still restored on resolve. 0 or -1 + err. */
int rules_actions_reload(rules_actions_t *a, const char *config_path, char *err, size_t errlen);
void rules_actions_free(rules_actions_t *a);
size_t rules_actions_count(rules_actions_t *a);

/* rules_hooks_t.transition, with ud = the actions. */
void rules_actions_on_transition(void *ud, const rules_alert_note_t *alert, bool firing, int64_t ts_ms);

/* sluice_rule_actions_total{result=...} and sluice_rule_actions_active. */
void rules_actions_write_metrics(rules_actions_t *a, buf_t *out);

#endif
