/* Unit tests for internal/rules/actions.c with a fake flow-control store: config parsing and its
 * errors, pause/revert, operator wins, not-running jobs left alone, dry_run, cooldown,
 * max_active, revert by duration, fractional rate limits from an input-rate query, adoption
 * after a restart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal/rules/actions.h"
#include "internal/util/log.h"

/* --- a fake control store: one state per job --- */
#define NJOBS 8
static struct {
    char job[32];
    control_state_t st;
    int64_t last_for_ms;
} jobs[NJOBS];
static int applies;

static control_state_t *job_state(const char *job)
{
    for (int i = 0; i < NJOBS; i++)
        if (strcmp(jobs[i].job, job) == 0)
            return &jobs[i].st;
    for (int i = 0; i < NJOBS; i++)
        if (!jobs[i].job[0]) {
            snprintf(jobs[i].job, sizeof(jobs[i].job), "%s", job);
            control_state_init(&jobs[i].st);
            return &jobs[i].st;
        }
    fail();
    return NULL;
}

static int fake_get(void *ud, const char *job, control_state_t *out)
{
    (void)ud;
    return control_state_copy(out, job_state(job));
}

static int fake_apply(void *ud, const char *job, const control_change_t *chg, const char *by, uint64_t *version,
                      char *err, size_t errlen)
{
    (void)ud;
    control_state_t *cur = job_state(job);
    if (chg->check_version && chg->expect_version != cur->version)
        return 1;
    control_state_t next;
    assert_int_equal(control_state_apply(cur, chg, 1000, by, &next), 0);
    control_state_free(cur);
    *cur = next;
    *version = cur->version;
    for (int i = 0; i < NJOBS; i++)
        if (&jobs[i].st == cur)
            jobs[i].last_for_ms = chg->for_ms;
    applies++;
    (void)err;
    (void)errlen;
    return 0;
}

static void reset_jobs(void)
{
    for (int i = 0; i < NJOBS; i++) {
        if (jobs[i].job[0])
            control_state_free(&jobs[i].st);
        memset(&jobs[i], 0, sizeof(jobs[i]));
    }
    applies = 0;
}

static char *write_cfg(const char *text)
{
    char *path = strdup("/tmp/sluice-actions-XXXXXX.yml");
    int fd = mkstemps(path, 4);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static rules_actions_t *new_actions(const char *cfg, storage_t *s)
{
    char *path = write_cfg(cfg);
    rules_control_ops_t ops = {.get = fake_get, .apply = fake_apply};
    char err[256];
    rules_actions_t *a = rules_actions_new(path, s, &ops, err, sizeof(err));
    if (!a)
        fail_msg("%s", err);
    unlink(path);
    free(path);
    return a;
}

static void transition(rules_actions_t *a, const char *alert, const char *job, bool firing, int64_t ts)
{
    label_t lv[] = {{"alertname", alert}, {"job_name", job}};
    labels_t ls = {lv, 2}, ann = {NULL, 0};
    rules_alert_note_t n = {.alertname = alert, .labels = &ls, .annotations = &ann};
    rules_actions_on_transition(a, &n, firing, ts);
}

static void test_config_errors(void **state)
{
    (void)state;
    rules_control_ops_t ops = {.get = fake_get, .apply = fake_apply};
    const char *bad[][2] = {
        {"actions:\n- alert: A\n", "'action' is required"},
        {"actions:\n- action: pause\n", "'alert' is required"},
        {"actions:\n- alert: A\n  action: explode\n", "unknown action"},
        {"actions:\n- alert: A\n  action: rate_limit\n", "needs rate_limit or rate_limit_fraction"},
        {"actions:\n- alert: A\n  action: pause\n  revert: sometimes\n", "revert must be on_resolve or a duration"},
        {"actions:\n- alert: A\n  action: pause\n  colour: red\n", "unknown field 'colour'"},
        {"actions:\n- alert: A\n  action: pause\n- alert: A\n  action: drain\n", "bound twice"},
        {"actions:\n- alert: A\n  action: drain\n  drain: [{attribute: t, regex: '('}]\n", "line 2"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *path = write_cfg(bad[i][0]);
        char err[256] = "";
        rules_actions_t *a = rules_actions_new(path, NULL, &ops, err, sizeof(err));
        if (a || !strstr(err, bad[i][1]))
            fail_msg("config %s: got %s, want an error with %s", bad[i][0], a ? "success" : err, bad[i][1]);
        unlink(path);
        free(path);
    }
    /* no file, no actions key: no bindings */
    char err[256];
    rules_actions_t *a = rules_actions_new(NULL, NULL, &ops, err, sizeof(err));
    assert_non_null(a);
    assert_int_equal(rules_actions_count(a), 0);
    rules_actions_free(a);
}

static void test_pause_revert_and_operator_wins(void **state)
{
    (void)state;
    reset_jobs();
    rules_actions_t *a = new_actions("actions:\n- alert: Hot\n  action: pause\n", NULL);
    transition(a, "Hot", "orders", true, 1000);
    assert_int_equal(job_state("orders")->spec.mode, CONTROL_PAUSED);
    assert_string_equal(job_state("orders")->updated_by, "rule:Hot");
    transition(a, "Hot", "orders", true, 2000); /* firing again (e.g. resend): no second change */
    assert_int_equal(applies, 1);
    transition(a, "Hot", "orders", false, 3000);
    assert_int_equal(job_state("orders")->spec.mode, CONTROL_RUNNING);
    assert_int_equal(job_state("orders")->version, 2);

    /* an operator changes the job while the alert fires: the revert is skipped */
    transition(a, "Hot", "orders", true, 4000);
    control_change_t op = {.spec = {.mode = CONTROL_RATE_LIMITED, .rate_limit_per_second = 5}};
    uint64_t v;
    char err[64];
    assert_int_equal(fake_apply(NULL, "orders", &op, "alice", &v, err, sizeof(err)), 0);
    transition(a, "Hot", "orders", false, 5000);
    assert_int_equal(job_state("orders")->spec.mode, CONTROL_RATE_LIMITED);
    assert_string_equal(job_state("orders")->updated_by, "alice");
    /* a job that is not running is left alone */
    transition(a, "Hot", "orders", true, 6000);
    assert_int_equal(job_state("orders")->spec.mode, CONTROL_RATE_LIMITED);
    /* an alert with no binding, or without the job label, does nothing */
    transition(a, "Other", "x", true, 7000);
    assert_int_equal(job_state("x")->version, 0);
    buf_t b = BUF_INIT;
    rules_actions_write_metrics(a, &b);
    assert_non_null(strstr(b.data, "sluice_rule_actions_total{result=\"applied\"} 2"));
    assert_non_null(strstr(b.data, "sluice_rule_actions_total{result=\"reverted\"} 1"));
    assert_non_null(strstr(b.data, "sluice_rule_actions_total{result=\"revert_skipped_newer_change\"} 1"));
    assert_non_null(strstr(b.data, "sluice_rule_actions_total{result=\"skipped_not_running\"} 1"));
    buf_free(&b);
    rules_actions_free(a);
}

static void test_dry_run_cooldown_max_active_duration(void **state)
{
    (void)state;
    reset_jobs();
    rules_actions_t *a = new_actions("actions:\n"
                                     "- alert: Dry\n  action: pause\n  dry_run: true\n"
                                     "- alert: Cool\n  action: drain\n  cooldown: 10s\n  max_active: 1\n"
                                     "  drain: [{attribute: table, regex: '^tmp_'}]\n"
                                     "- alert: Timed\n  action: rate_limit\n  rate_limit: 100\n  revert: 5m\n",
                                     NULL);
    transition(a, "Dry", "j1", true, 1000);
    assert_int_equal(applies, 0);
    transition(a, "Cool", "j1", true, 1000);
    assert_int_equal(job_state("j1")->spec.mode, CONTROL_DRAINING);
    assert_int_equal(job_state("j1")->spec.ndrain, 1);
    transition(a, "Cool", "j2", true, 1000); /* max_active 1 */
    assert_int_equal(job_state("j2")->version, 0);
    transition(a, "Cool", "j1", false, 2000);
    assert_int_equal(job_state("j1")->spec.mode, CONTROL_RUNNING);
    transition(a, "Cool", "j1", true, 5000); /* within the 10s cooldown */
    assert_int_equal(job_state("j1")->spec.mode, CONTROL_RUNNING);
    transition(a, "Cool", "j1", true, 13000); /* after it */
    assert_int_equal(job_state("j1")->spec.mode, CONTROL_DRAINING);
    /* revert by duration: the change carries for; the resolve does not touch the job */
    transition(a, "Timed", "j3", true, 1000);
    assert_int_equal(job_state("j3")->spec.rate_limit_per_second, 100);
    assert_true(job_state("j3")->has_revert);
    int before = applies;
    transition(a, "Timed", "j3", false, 2000);
    assert_int_equal(applies, before);
    rules_actions_free(a);
}

static void test_fraction_and_adoption(void **state)
{
    (void)state;
    reset_jobs();
    storage_options_t o;
    storage_options_default(&o);
    o.path = NULL;
    o.no_background = true;
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    int64_t now = storage_now_ms(s);
    /* The job as Flink reports it: a source chain "Source: Orders -> Map" (2 subtasks reading
     * 2500 + 1500 records/s) feeding a window task. The input rate is the source operators'
     * numRecordsOut (4000/s), not the sum of every task's or operator's rate (which counts each
     * record once per hop: 8000 over the tasks here, more over the operators). */
    static const struct {
        const char *name, *task, *op, *sub;
        double v;
    } in[] = {
        {"flink_taskmanager_job_task_operator_numRecordsOutPerSecond", "Source:_Orders____Map", "Source:_Orders", "0", 2500},
        {"flink_taskmanager_job_task_operator_numRecordsOutPerSecond", "Source:_Orders____Map", "Source:_Orders", "1", 1500},
        {"flink_taskmanager_job_task_operator_numRecordsOutPerSecond", "Source:_Orders____Map", "Map", "0", 2500},
        {"flink_taskmanager_job_task_operator_numRecordsOutPerSecond", "Source:_Orders____Map", "Map", "1", 1500},
        {"flink_taskmanager_job_task_operator_numRecordsOutPerSecond", "Window____Sink", "Window", "0", 4000},
        {"flink_taskmanager_job_task_numRecordsInPerSecond", "Source:_Orders____Map", NULL, "0", 2500},
        {"flink_taskmanager_job_task_numRecordsInPerSecond", "Source:_Orders____Map", NULL, "1", 1500},
        {"flink_taskmanager_job_task_numRecordsInPerSecond", "Window____Sink", NULL, "0", 4000},
    };
    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
        label_t lv[5]; /* sorted by name */
        size_t n = 0;
        lv[n++] = (label_t){"__name__", in[i].name};
        lv[n++] = (label_t){"job_name", "orders"};
        if (in[i].op)
            lv[n++] = (label_t){"operator_name", in[i].op};
        lv[n++] = (label_t){"subtask_index", in[i].sub};
        lv[n++] = (label_t){"task_name", in[i].task};
        storage_sample_t smp = {.labels = {lv, n}, .t = now, .v = in[i].v};
        assert_int_equal(storage_append(s, &smp, 1, NULL), STORAGE_OK);
    }
    rules_actions_t *a = new_actions("actions:\n- alert: Hot\n  action: rate_limit\n  rate_limit_fraction: 0.25\n", s);
    transition(a, "Hot", "orders", true, now);
    assert_int_equal(job_state("orders")->spec.mode, CONTROL_RATE_LIMITED);
    assert_int_equal(job_state("orders")->spec.rate_limit_per_second, 1000); /* 0.25 x 4000, the sources' rate */
    /* no input rate known: nothing is done */
    transition(a, "Hot", "quiet", true, now);
    assert_int_equal(job_state("quiet")->version, 0);
    rules_actions_free(a);

    /* a restart: new module, the job still limited by rule:Hot -> adopted, restored on resolve */
    a = new_actions("actions:\n- alert: Hot\n  action: rate_limit\n  rate_limit_fraction: 0.25\n", s);
    transition(a, "Hot", "orders", true, now + 1000);
    transition(a, "Hot", "orders", false, now + 2000);
    assert_int_equal(job_state("orders")->spec.mode, CONTROL_RUNNING);
    rules_actions_free(a);
    storage_close(s);
    reset_jobs();
}

int main(void)
{
    log_set_level(LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_pause_revert_and_operator_wins),
        cmocka_unit_test(test_dry_run_cooldown_max_active_duration),
        cmocka_unit_test(test_fraction_and_adoption),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
