/*
 * rules/actions — closed-loop flow control; see actions.h for the config and the safety rules.
 *
 * Per (alert, job) the module remembers one "active" change: the version its change produced
 * and the spec it replaced. Transitions, and where they happen:
 *
 *   alert fires   -> act_fire():    checks (binding, job label, cooldown, max_active, RUNNING),
 *                                   then one control change with check_version; remembers it
 *   alert resolves-> act_resolve(): forgets it; if revert is on_resolve and the job's version is
 *                                   still ours, one control change back to the remembered spec
 *
 * Every outcome is counted by result (metrics) and logged.
 */
#include "internal/rules/actions.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "internal/promql/engine.h"
#include "internal/rules/rulefile.h"
#include "internal/util/log.h"
#include "internal/util/parse.h"

/* A job's input rate is what its source operators emit: numRecordsOut of an operator named
 * "Source: ..." counts each record it read once, for FLIP-27 and legacy sources alike (a legacy
 * source task reports numRecordsIn 0). Summing numRecordsIn over every task would count a record
 * once per task it crosses (and miss legacy sources), so the limit would be far above the input. */
#define ACT_DEFAULT_INPUT_QUERY                                                                                       \
    "sum(flink_taskmanager_job_task_operator_numRecordsOutPerSecond{job_name=\"$job\",operator_name=~\"Source:.*\"})"

typedef struct {
    char *alert;
    control_mode_t mode;
    char *job_label;
    int64_t rate;
    double fraction;
    char *input_query;
    control_match_t *drain;
    size_t ndrain;
    int64_t revert_after_ms; /* 0 = on_resolve */
    int64_t cooldown_ms;
    int64_t max_active; /* 0 = no limit */
    bool dry_run;
} act_binding_t;

typedef struct {
    char *alert, *job;
    uint64_t version;    /* the job's version after our change */
    control_spec_t prev; /* what to restore */
    bool revert_on_resolve;
} act_active_t;

typedef struct {
    char *alert, *job;
    int64_t until_ms;
} act_cooldown_t;

enum {
    ACT_APPLIED,
    ACT_REVERTED,
    ACT_DRY_RUN,
    ACT_SKIPPED_NOT_RUNNING,
    ACT_SKIPPED_COOLDOWN,
    ACT_SKIPPED_MAX_ACTIVE,
    ACT_SKIPPED_NO_JOB,
    ACT_SKIPPED_NO_RATE,
    ACT_CONFLICT,
    ACT_REVERT_SKIPPED_NEWER_CHANGE,
    ACT_ERROR,
    ACT_NRESULTS
};
static const char *const act_result_names[ACT_NRESULTS] = {
    "applied",
    "reverted",
    "dry_run",
    "skipped_not_running",
    "skipped_cooldown",
    "skipped_max_active",
    "skipped_no_job",
    "skipped_no_input_rate",
    "conflict",
    "revert_skipped_newer_change",
    "error",
};

struct rules_actions {
    pthread_mutex_t mu;
    storage_t *storage;
    rules_control_ops_t ops;
    act_binding_t *b;
    size_t nb;
    act_active_t *act;
    size_t nact, capact;
    act_cooldown_t *cd;
    size_t ncd;
    uint64_t results[ACT_NRESULTS];
};

/* --- config --------------------------------------------------------------------------------------- */

static void act_bindings_free(act_binding_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(b[i].alert);
        free(b[i].job_label);
        free(b[i].input_query);
        control_spec_t s = {.mode = CONTROL_DRAINING, .drain = b[i].drain, .ndrain = b[i].ndrain};
        control_spec_free(&s);
    }
    free(b);
}

static const char *act_scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int act_parse_binding(yaml_document_t *doc, yaml_node_t *n, act_binding_t *b, const char *path, char *err,
                             size_t errlen)
{
    size_t line = n->start_mark.line + 1;
    if (n->type != YAML_MAPPING_NODE) {
        snprintf(err, errlen, "config file %s: line %zu: an action must be a mapping", path, line);
        return -1;
    }
    b->mode = (control_mode_t)-1;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        const char *key = act_scalar(k) ? act_scalar(k) : "";
        const char *val = act_scalar(v);
        size_t vl = v->start_mark.line + 1;
        if (strcmp(key, "drain") == 0) {
            if (v->type != YAML_SEQUENCE_NODE) {
                snprintf(err, errlen, "config file %s: line %zu: actions: drain must be a list of {attribute, regex}",
                         path, vl);
                return -1;
            }
            size_t cnt = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
            b->drain = calloc(cnt ? cnt : 1, sizeof(*b->drain));
            for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
                yaml_node_t *m = yaml_document_get_node(doc, *it);
                control_match_t *cm = &b->drain[b->ndrain++];
                if (m->type != YAML_MAPPING_NODE) {
                    snprintf(err, errlen, "config file %s: line %zu: actions: drain entries are {attribute, regex}",
                             path, m->start_mark.line + 1);
                    return -1;
                }
                for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < m->data.mapping.pairs.top; q++) {
                    const char *mk = act_scalar(yaml_document_get_node(doc, q->key));
                    const char *mv = act_scalar(yaml_document_get_node(doc, q->value));
                    if (mk && mv && strcmp(mk, "attribute") == 0)
                        cm->attribute = strdup(mv);
                    else if (mk && mv && strcmp(mk, "regex") == 0)
                        cm->regex = strdup(mv);
                    else {
                        snprintf(err, errlen, "config file %s: line %zu: actions: unknown drain field '%s'", path,
                                 m->start_mark.line + 1, mk ? mk : "");
                        return -1;
                    }
                }
                if (!cm->attribute || !cm->regex) {
                    snprintf(err, errlen, "config file %s: line %zu: actions: drain entries need attribute and regex",
                             path, m->start_mark.line + 1);
                    return -1;
                }
            }
            continue;
        }
        if (!val) {
            snprintf(err, errlen, "config file %s: line %zu: actions: '%s' must be a single value", path, vl, key);
            return -1;
        }
        if (strcmp(key, "alert") == 0) {
            free(b->alert);
            b->alert = strdup(val);
        } else if (strcmp(key, "action") == 0) {
            if (strcmp(val, "pause") == 0)
                b->mode = CONTROL_PAUSED;
            else if (strcmp(val, "rate_limit") == 0)
                b->mode = CONTROL_RATE_LIMITED;
            else if (strcmp(val, "drain") == 0)
                b->mode = CONTROL_DRAINING;
            else {
                snprintf(err, errlen,
                         "config file %s: line %zu: actions: unknown action \"%s\" (pause, rate_limit, drain)", path,
                         vl, val);
                return -1;
            }
        } else if (strcmp(key, "job_label") == 0) {
            free(b->job_label);
            b->job_label = strdup(val);
        } else if (strcmp(key, "rate_limit") == 0) {
            if (parse_int64(val, &b->rate) != 0 || b->rate < 1 || b->rate > CONTROL_MAX_RATE) {
                snprintf(err, errlen, "config file %s: line %zu: actions: rate_limit must be 1..%lld records/s", path,
                         vl, (long long)CONTROL_MAX_RATE);
                return -1;
            }
        } else if (strcmp(key, "rate_limit_fraction") == 0) {
            if (parse_double(val, &b->fraction) != 0 || !(b->fraction > 0 && b->fraction <= 1)) {
                snprintf(err, errlen, "config file %s: line %zu: actions: rate_limit_fraction must be in (0, 1]", path,
                         vl);
                return -1;
            }
        } else if (strcmp(key, "input_rate_query") == 0) {
            free(b->input_query);
            b->input_query = strdup(val);
        } else if (strcmp(key, "revert") == 0) {
            if (strcmp(val, "on_resolve") == 0)
                b->revert_after_ms = 0;
            else if (parse_duration_ms(val, &b->revert_after_ms) != 0 || b->revert_after_ms <= 0 ||
                     b->revert_after_ms > CONTROL_MAX_FOR_MS) {
                snprintf(err, errlen, "config file %s: line %zu: actions: revert must be on_resolve or a duration",
                         path, vl);
                return -1;
            }
        } else if (strcmp(key, "cooldown") == 0) {
            if (parse_duration_ms(val, &b->cooldown_ms) != 0) {
                snprintf(err, errlen, "config file %s: line %zu: actions: invalid cooldown \"%s\"", path, vl, val);
                return -1;
            }
        } else if (strcmp(key, "max_active") == 0) {
            if (parse_int64(val, &b->max_active) != 0) {
                snprintf(err, errlen, "config file %s: line %zu: actions: invalid max_active \"%s\"", path, vl, val);
                return -1;
            }
        } else if (strcmp(key, "dry_run") == 0) {
            if (parse_bool(val, &b->dry_run) != 0) {
                snprintf(err, errlen, "config file %s: line %zu: actions: invalid dry_run \"%s\"", path, vl, val);
                return -1;
            }
        } else {
            snprintf(err, errlen, "config file %s: line %zu: actions: unknown field '%s'", path, k->start_mark.line + 1,
                     key);
            return -1;
        }
    }
    if (!b->alert || !b->alert[0]) {
        snprintf(err, errlen, "config file %s: line %zu: actions: 'alert' is required", path, line);
        return -1;
    }
    if ((int)b->mode < 0) {
        snprintf(err, errlen, "config file %s: line %zu: actions: 'action' is required", path, line);
        return -1;
    }
    if (b->mode == CONTROL_RATE_LIMITED && !b->rate && b->fraction == 0) {
        snprintf(err, errlen, "config file %s: line %zu: actions: rate_limit needs rate_limit or rate_limit_fraction",
                 path, line);
        return -1;
    }
    if (!b->job_label)
        b->job_label = strdup("job_name");
    if (!b->input_query)
        b->input_query = strdup(ACT_DEFAULT_INPUT_QUERY);
    if (b->ndrain) {
        control_spec_t s = {.mode = CONTROL_DRAINING, .drain = b->drain, .ndrain = b->ndrain};
        char verr[256];
        if (control_spec_validate(&s, verr, sizeof(verr)) != 0) {
            snprintf(err, errlen, "config file %s: line %zu: actions: %s", path, line, verr);
            return -1;
        }
    }
    return 0;
}

/* Parses the bindings of path. 0 (possibly none) or -1 + err. */
static int act_load(const char *path, act_binding_t **out, size_t *nout, char *err, size_t errlen)
{
    *out = NULL;
    *nout = 0;
    if (!path || !path[0])
        return 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open config file %s", path);
        return -1;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        snprintf(err, errlen, "config file %s: line %zu: %s", path, parser.problem_mark.line + 1,
                 parser.problem ? parser.problem : "invalid YAML");
        yaml_parser_delete(&parser);
        fclose(f);
        return -1;
    }
    int rc = 0;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_node_t *list = NULL;
    if (root && root->type == YAML_MAPPING_NODE)
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
            const char *k = act_scalar(yaml_document_get_node(&doc, p->key));
            if (k && strcmp(k, "actions") == 0)
                list = yaml_document_get_node(&doc, p->value);
        }
    if (list && list->type == YAML_SEQUENCE_NODE) {
        size_t cnt = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
        act_binding_t *b = calloc(cnt ? cnt : 1, sizeof(*b));
        size_t nb = 0;
        for (yaml_node_item_t *it = list->data.sequence.items.start; it < list->data.sequence.items.top && rc == 0;
             it++) {
            rc = act_parse_binding(&doc, yaml_document_get_node(&doc, *it), &b[nb++], path, err, errlen);
            for (size_t j = 0; rc == 0 && j + 1 < nb; j++)
                if (strcmp(b[j].alert, b[nb - 1].alert) == 0) {
                    snprintf(err, errlen, "config file %s: actions: alert \"%s\" is bound twice", path, b[j].alert);
                    rc = -1;
                }
        }
        if (rc != 0)
            act_bindings_free(b, nb);
        else {
            *out = b;
            *nout = nb;
        }
    } else if (list && !(list->type == YAML_SCALAR_NODE && !list->data.scalar.length)) {
        snprintf(err, errlen, "config file %s: line %zu: actions must be a list", path, list->start_mark.line + 1);
        rc = -1;
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
}

rules_actions_t *rules_actions_new(const char *config_path, storage_t *storage, const rules_control_ops_t *ops,
                                   char *err, size_t errlen)
{
    rules_actions_t *a = calloc(1, sizeof(*a));
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (act_load(config_path, &a->b, &a->nb, err, errlen) != 0) {
        free(a);
        return NULL;
    }
    a->storage = storage;
    a->ops = *ops;
    pthread_mutex_init(&a->mu, NULL);
    return a;
}

int rules_actions_reload(rules_actions_t *a, const char *config_path, char *err, size_t errlen)
{
    act_binding_t *b;
    size_t nb;
    if (act_load(config_path, &b, &nb, err, errlen) != 0)
        return -1;
    pthread_mutex_lock(&a->mu);
    act_bindings_free(a->b, a->nb);
    a->b = b;
    a->nb = nb;
    pthread_mutex_unlock(&a->mu);
    return 0;
}

void rules_actions_free(rules_actions_t *a)
{
    if (!a)
        return;
    act_bindings_free(a->b, a->nb);
    for (size_t i = 0; i < a->nact; i++) {
        free(a->act[i].alert);
        free(a->act[i].job);
        control_spec_free(&a->act[i].prev);
    }
    free(a->act);
    for (size_t i = 0; i < a->ncd; i++) {
        free(a->cd[i].alert);
        free(a->cd[i].job);
    }
    free(a->cd);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

size_t rules_actions_count(rules_actions_t *a)
{
    pthread_mutex_lock(&a->mu);
    size_t n = a->nb;
    pthread_mutex_unlock(&a->mu);
    return n;
}

/* --- acting ------------------------------------------------------------------------------------------ */

static act_active_t *act_find(rules_actions_t *a, const char *alert, const char *job)
{
    for (size_t i = 0; i < a->nact; i++)
        if (strcmp(a->act[i].alert, alert) == 0 && strcmp(a->act[i].job, job) == 0)
            return &a->act[i];
    return NULL;
}

static void act_count(rules_actions_t *a, int result, const char *alert, const char *job, const char *msg)
{
    a->results[result]++;
    if (result == ACT_APPLIED || result == ACT_REVERTED || result == ACT_DRY_RUN)
        log_info("rules", msg, LF_S("alertname", alert), LF_S("job", job), LF_S("result", act_result_names[result]));
    else
        log_warn("rules", msg, LF_S("alertname", alert), LF_S("job", job), LF_S("result", act_result_names[result]));
}

/* The job's input rate from the binding's query, or NAN. */
static double act_input_rate(rules_actions_t *a, const act_binding_t *b, const char *job, int64_t ts)
{
    buf_t q = BUF_INIT;
    for (const char *s = b->input_query; *s; s++) {
        if (strncmp(s, "$job", 4) == 0) {
            for (const char *j = job; *j; j++) {
                if (*j == '"' || *j == '\\')
                    buf_putc(&q, '\\');
                buf_putc(&q, *j);
            }
            s += 3;
        } else {
            buf_putc(&q, *s);
        }
    }
    char err[256];
    double v = NAN;
    promql_ast_t *ast = promql_parse(q.data ? q.data : "", err, sizeof(err));
    if (ast && a->storage) {
        querier_t *qr = storage_querier(a->storage);
        promql_result_t *r = qr ? promql_exec_instant(qr, ast, ts, NULL) : NULL;
        if (r && r->err_kind == PROMQL_ERR_NONE) {
            if (r->value.type == PROMQL_VT_VECTOR && r->value.nsamples > 0)
                v = r->value.samples[0].v;
            else if (r->value.type == PROMQL_VT_SCALAR)
                v = r->value.scalar;
        }
        if (r)
            promql_result_free(r);
        querier_close(qr);
    }
    if (ast)
        promql_ast_free(ast);
    buf_free(&q);
    return v;
}

static void act_fire(rules_actions_t *a, const act_binding_t *b, const rules_alert_note_t *al, const char *job,
                     int64_t ts)
{
    const char *alert = al->alertname;
    if (act_find(a, alert, job))
        return;
    for (size_t i = 0; i < a->ncd; i++)
        if (strcmp(a->cd[i].alert, alert) == 0 && strcmp(a->cd[i].job, job) == 0 && ts < a->cd[i].until_ms) {
            act_count(a, ACT_SKIPPED_COOLDOWN, alert, job, "closed loop: in cooldown, not acting");
            return;
        }
    if (b->max_active > 0) {
        int64_t n = 0;
        for (size_t i = 0; i < a->nact; i++)
            n += strcmp(a->act[i].alert, alert) == 0;
        if (n >= b->max_active) {
            act_count(a, ACT_SKIPPED_MAX_ACTIVE, alert, job, "closed loop: max_active reached, not acting");
            return;
        }
    }
    char by[300];
    snprintf(by, sizeof(by), "rule:%s", alert);
    control_state_t cur;
    if (a->ops.get(a->ops.ud, job, &cur) != 0) {
        act_count(a, ACT_ERROR, alert, job, "closed loop: cannot read the job's control state");
        return;
    }
    if (cur.spec.mode != CONTROL_RUNNING) {
        if (cur.updated_by && strcmp(cur.updated_by, by) == 0 && cur.spec.mode == b->mode && b->revert_after_ms == 0) {
            /* left by this rule before a restart: adopt it so the resolve restores RUNNING */
            act_active_t *ac = NULL;
            if (a->nact == a->capact) {
                a->capact = a->capact ? a->capact * 2 : 8;
                a->act = realloc(a->act, a->capact * sizeof(*a->act));
            }
            if (a->act) {
                ac = &a->act[a->nact++];
                memset(ac, 0, sizeof(*ac));
                ac->alert = strdup(alert);
                ac->job = strdup(job);
                ac->version = cur.version;
                ac->prev.mode = CONTROL_RUNNING;
                ac->revert_on_resolve = true;
                log_info("rules", "closed loop: adopted a state this rule set before a restart",
                         LF_S("alertname", alert), LF_S("job", job));
            }
        } else {
            act_count(a, ACT_SKIPPED_NOT_RUNNING, alert, job,
                      "closed loop: the job is not running (changed by someone else); leaving it alone");
        }
        control_state_free(&cur);
        return;
    }
    control_change_t chg = {0};
    chg.spec.mode = b->mode;
    if (b->mode == CONTROL_RATE_LIMITED) {
        int64_t rate = b->rate;
        if (b->fraction > 0) {
            double in = act_input_rate(a, b, job, ts);
            if (isfinite(in) && in > 0)
                rate = (int64_t)llround(in * b->fraction);
            if (rate < 1 && isfinite(in) && in > 0)
                rate = 1;
        }
        if (rate < 1) {
            act_count(a, ACT_SKIPPED_NO_RATE, alert, job,
                      "closed loop: no input rate known for a fractional rate limit");
            control_state_free(&cur);
            return;
        }
        chg.spec.rate_limit_per_second = rate > CONTROL_MAX_RATE ? CONTROL_MAX_RATE : rate;
    }
    if (b->mode == CONTROL_DRAINING && b->ndrain) {
        control_spec_t src = {.mode = CONTROL_DRAINING, .drain = b->drain, .ndrain = b->ndrain};
        control_spec_t cp;
        if (control_spec_copy(&cp, &src) == 0) {
            chg.spec.drain = cp.drain;
            chg.spec.ndrain = cp.ndrain;
        }
    }
    buf_t reason = BUF_INIT;
    buf_printf(&reason, "alert %s firing", alert);
    const char *summary = labels_get(al->annotations, "summary");
    if (summary)
        buf_printf(&reason, ": %s", summary);
    if (reason.len > CONTROL_MAX_REASON_LEN)
        reason.len = CONTROL_MAX_REASON_LEN, reason.data[reason.len] = 0;
    chg.reason = reason.data;
    chg.for_ms = b->revert_after_ms;
    chg.check_version = true;
    chg.expect_version = cur.version;
    if (b->dry_run) {
        log_info("rules", "closed loop (dry run): would change the job", LF_S("alertname", alert), LF_S("job", job),
                 LF_S("mode", control_mode_name(b->mode)),
                 LF_I("rate_limit_per_second", chg.spec.rate_limit_per_second));
        a->results[ACT_DRY_RUN]++;
    } else {
        uint64_t version = 0;
        char err[256] = "";
        int rc = a->ops.apply(a->ops.ud, job, &chg, by, &version, err, sizeof(err));
        if (rc == 0) {
            if (a->nact == a->capact) {
                a->capact = a->capact ? a->capact * 2 : 8;
                a->act = realloc(a->act, a->capact * sizeof(*a->act));
                if (!a->act)
                    abort();
            }
            act_active_t *ac = &a->act[a->nact++];
            memset(ac, 0, sizeof(*ac));
            ac->alert = strdup(alert);
            ac->job = strdup(job);
            ac->version = version;
            control_spec_copy(&ac->prev, &cur.spec);
            ac->revert_on_resolve = b->revert_after_ms == 0;
            act_count(a, ACT_APPLIED, alert, job, "closed loop: alert firing, job changed");
        } else if (rc == 1) {
            act_count(a, ACT_CONFLICT, alert, job, "closed loop: the job changed meanwhile; not acting");
        } else {
            log_error("rules", "closed loop: control change failed", LF_S("err", err));
            act_count(a, ACT_ERROR, alert, job, "closed loop: control change failed");
        }
    }
    buf_free(&reason);
    control_spec_free(&chg.spec);
    control_state_free(&cur);
}

static void act_resolve(rules_actions_t *a, const act_binding_t *b, const rules_alert_note_t *al, const char *job,
                        int64_t ts)
{
    const char *alert = al->alertname;
    act_active_t *ac = act_find(a, alert, job);
    if (!ac)
        return;
    act_active_t mine = *ac;
    *ac = a->act[--a->nact];
    int64_t cooldown = b ? b->cooldown_ms : 0;
    if (cooldown > 0) {
        act_cooldown_t *cd = NULL;
        for (size_t i = 0; i < a->ncd && !cd; i++)
            if (strcmp(a->cd[i].alert, alert) == 0 && strcmp(a->cd[i].job, job) == 0)
                cd = &a->cd[i];
        if (!cd) {
            act_cooldown_t *n = realloc(a->cd, (a->ncd + 1) * sizeof(*n));
            if (n) {
                a->cd = n;
                cd = &a->cd[a->ncd++];
                cd->alert = strdup(alert);
                cd->job = strdup(job);
            }
        }
        if (cd)
            cd->until_ms = ts + cooldown;
    }
    if (mine.revert_on_resolve) {
        char by[300];
        snprintf(by, sizeof(by), "rule:%s", alert);
        control_state_t cur;
        if (a->ops.get(a->ops.ud, job, &cur) != 0) {
            act_count(a, ACT_ERROR, alert, job, "closed loop: cannot read the job's control state");
        } else if (cur.version != mine.version) {
            act_count(a, ACT_REVERT_SKIPPED_NEWER_CHANGE, alert, job,
                      "closed loop: alert resolved but the job was changed since; the newer change stays");
            control_state_free(&cur);
        } else {
            control_change_t chg = {0};
            control_spec_copy(&chg.spec, &mine.prev);
            char reason[512];
            snprintf(reason, sizeof(reason), "alert %s resolved", alert);
            chg.reason = reason;
            chg.check_version = true;
            chg.expect_version = mine.version;
            uint64_t version;
            char err[256] = "";
            int rc = a->ops.apply(a->ops.ud, job, &chg, by, &version, err, sizeof(err));
            if (rc == 0)
                act_count(a, ACT_REVERTED, alert, job, "closed loop: alert resolved, previous state restored");
            else if (rc == 1)
                act_count(a, ACT_REVERT_SKIPPED_NEWER_CHANGE, alert, job,
                          "closed loop: alert resolved but the job was changed since; the newer change stays");
            else
                act_count(a, ACT_ERROR, alert, job, "closed loop: control change failed");
            control_spec_free(&chg.spec);
            control_state_free(&cur);
        }
    }
    free(mine.alert);
    free(mine.job);
    control_spec_free(&mine.prev);
}

void rules_actions_on_transition(void *ud, const rules_alert_note_t *al, bool firing, int64_t ts_ms)
{
    rules_actions_t *a = ud;
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    const act_binding_t *b = NULL;
    for (size_t i = 0; i < a->nb && !b; i++)
        if (strcmp(a->b[i].alert, al->alertname) == 0)
            b = &a->b[i];
    const char *label = b ? b->job_label : "job_name";
    const char *job = labels_get(al->labels, label);
    if (firing && b) {
        if (!job || !job[0])
            act_count(a, ACT_SKIPPED_NO_JOB, al->alertname, "", "closed loop: the alert has no job label");
        else
            act_fire(a, b, al, job, ts_ms);
    } else if (!firing && job) {
        /* also for a binding removed by a reload: what we changed is still restored */
        act_resolve(a, b, al, job, ts_ms);
    }
    pthread_mutex_unlock(&a->mu);
}

void rules_actions_write_metrics(rules_actions_t *a, buf_t *out)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    buf_puts(out, "# HELP sluice_rule_actions_total Closed-loop flow-control decisions by result.\n"
                  "# TYPE sluice_rule_actions_total counter\n");
    for (int i = 0; i < ACT_NRESULTS; i++)
        buf_printf(out, "sluice_rule_actions_total{result=\"%s\"} %llu\n", act_result_names[i],
                   (unsigned long long)a->results[i]);
    buf_printf(out,
               "# HELP sluice_rule_actions_active Jobs currently changed by an alert, to be restored on resolve.\n"
               "# TYPE sluice_rule_actions_active gauge\nsluice_rule_actions_active %zu\n",
               a->nact);
    pthread_mutex_unlock(&a->mu);
}
