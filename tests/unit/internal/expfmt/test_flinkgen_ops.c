/* Unit tests of flinkgen's operations scenario (flinkgen.h): bodies parse as Flink's reporter
 * output, are deterministic, and each incident moves the series the alert pack watches the way
 * the real failure would (and only while it should). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/expfmt/family.h"
#include "internal/expfmt/flinkgen.h"
#include "internal/expfmt/text_parse.h"
#include "internal/util/buf.h"

/* The value of the first sample of family `fam` whose label text contains every `want` substring
 * ("" = any), read back from the parsed body; asserts it exists. */
static double get(buf_t *body, const char *fam, const char *want1, const char *want2)
{
    const char *p = body->data;
    size_t flen = strlen(fam);
    while ((p = strstr(p, fam)) != NULL) {
        const char *eol = strchr(p, '\n');
        assert_non_null(eol);
        if (p[flen] == '{' && (p == body->data || p[-1] == '\n')) {
            char line[2048];
            size_t n = (size_t)(eol - p) < sizeof(line) - 1 ? (size_t)(eol - p) : sizeof(line) - 1;
            memcpy(line, p, n);
            line[n] = '\0';
            if (strstr(line, want1) && strstr(line, want2))
                return strtod(strrchr(line, ' ') + 1, NULL);
        }
        p = eol;
    }
    fail_msg("no sample of %s with %s %s", fam, want1, want2);
    return 0;
}

static buf_t tm_body(unsigned tm, uint64_t tick, const flinkgen_incident_t *inc, size_t ninc)
{
    buf_t b;
    buf_init(&b);
    flinkgen_ops_taskmanager(&b, tm, 7, tick, inc, ninc);
    return b;
}

static buf_t jm_body(uint64_t tick, const flinkgen_incident_t *inc, size_t ninc)
{
    buf_t b;
    buf_init(&b);
    flinkgen_jobmanager(&b, 7, tick, inc, ninc);
    return b;
}

static void test_parse_and_determinism(void **state)
{
    (void)state;
    flinkgen_incident_t inc[2];
    char err[256];
    assert_int_equal(flinkgen_incident_parse("lag:orders:10:20", &inc[0], err, sizeof(err)), 0);
    assert_int_equal(flinkgen_incident_parse("restart:clicks:5:6", &inc[1], err, sizeof(err)), 0);
    assert_int_equal(inc[1].kind, FLINKGEN_RESTART);
    assert_int_equal(inc[1].job, 1);
    const char *bad[] = {"bogus:orders:1:2", "lag:nojob:1:2", "lag:orders:5:2", "lag:orders:1", "lag:orders:1:2x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(flinkgen_incident_parse(bad[i], &inc[0], err, sizeof(err)), -1);
    assert_int_equal(flinkgen_incident_parse("lag:orders:10:20", &inc[0], err, sizeof(err)), 0);

    arena_t *a = arena_create(0);
    for (unsigned tm = 0; tm <= FLINKGEN_OPS_TMS; tm++) { /* tm == FLINKGEN_OPS_TMS: the JobManager */
        buf_t b1, b2;
        buf_init(&b1);
        buf_init(&b2);
        size_t n = tm < FLINKGEN_OPS_TMS ? flinkgen_ops_taskmanager(&b1, tm, 7, 15, inc, 2)
                                         : flinkgen_jobmanager(&b1, 7, 15, inc, 2);
        if (tm < FLINKGEN_OPS_TMS)
            flinkgen_ops_taskmanager(&b2, tm, 7, 15, inc, 2);
        else
            flinkgen_jobmanager(&b2, 7, 15, inc, 2);
        assert_int_equal(b1.len, b2.len);
        assert_memory_equal(b1.data, b2.data, b1.len);
        expfmt_result_t r;
        arena_reset(a);
        assert_int_equal(expfmt_parse_text(b1.data, b1.len, false, NULL, a, &r, err, sizeof(err)), 0);
        assert_int_equal(r.nsamples, n);
        for (size_t f = 0; f < r.nfamilies; f++) {
            assert_int_equal(r.families[f].type, EXPFMT_GAUGE);
            assert_true(strncmp(r.families[f].name, tm < FLINKGEN_OPS_TMS ? "flink_taskmanager_" : "flink_jobmanager_",
                                tm < FLINKGEN_OPS_TMS ? 18 : 17) == 0);
        }
        buf_free(&b1);
        buf_free(&b2);
    }
    arena_destroy(a);
}

#define SRC_OUT "flink_taskmanager_job_task_operator_numRecordsOutPerSecond"
#define PENDING "flink_taskmanager_job_task_operator_pendingRecords"
#define LEGACY_LAG "flink_taskmanager_job_task_operator_KafkaConsumer_records_lag_max"
#define SRC_LAG "flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_records_lag_max"

static void test_lag_stall_surge(void **state)
{
    (void)state;
    flinkgen_incident_t inc[] = {
        {FLINKGEN_LAG, 0, 100, 120}, {FLINKGEN_STALL, 1, 100, 110}, {FLINKGEN_SURGE, 0, 200, 205}};
    /* tm 0 runs orders (KafkaSource), tm 1 clicks (FlinkKafkaConsumer) */
    buf_t calm = tm_body(0, 99, inc, 3), lag = tm_body(0, 119, inc, 3), after = tm_body(0, 124, inc, 3);
    assert_true(get(&calm, PENDING, "subtask_index=\"0\"", "") < 1000);
    assert_true(get(&lag, PENDING, "subtask_index=\"0\"", "") >= 20000);
    assert_true(get(&lag, SRC_LAG, "subtask_index=\"1\"", "") >= 8000);  /* the worst partition of ~3 */
    assert_true(get(&after, PENDING, "subtask_index=\"0\"", "") < 1000); /* drained */
    assert_null(strstr(calm.data, LEGACY_LAG "{"));
    double before = get(&calm, SRC_OUT, "operator_name=\"Source:_Kafka_Orders\"", "subtask_index=\"0\"");
    buf_t surge = tm_body(0, 202, inc, 3);
    assert_true(get(&surge, SRC_OUT, "operator_name=\"Source:_Kafka_Orders\"", "subtask_index=\"0\"") > 2.5 * before);

    buf_t st = tm_body(1, 105, inc, 3), st_after = tm_body(1, 111, inc, 3);
    assert_true(get(&st, SRC_OUT, "operator_name=\"Source:_Kafka_Clicks\"", "subtask_index=\"0\"") == 0);
    assert_true(get(&st, SRC_OUT, "operator_name=\"Source:_Kafka_Clicks\"", "subtask_index=\"1\"") > 0);
    assert_true(get(&st, LEGACY_LAG, "subtask_index=\"0\"", "") > 300);
    assert_true(get(&st_after, SRC_OUT, "operator_name=\"Source:_Kafka_Clicks\"", "subtask_index=\"0\"") > 0);
    /* a legacy source task reads nothing by Flink's count; a FLIP-27 one counts what it read */
    assert_true(get(&st_after, "flink_taskmanager_job_task_numRecordsInPerSecond", "task_name=\"Source:", "") == 0);
    assert_true(get(&calm, "flink_taskmanager_job_task_numRecordsInPerSecond", "task_name=\"Source:", "") > 0);
    buf_free(&calm), buf_free(&lag), buf_free(&after), buf_free(&surge), buf_free(&st), buf_free(&st_after);
}

#define GC(x) "flink_taskmanager_Status_JVM_GarbageCollector_G1_" x
static void test_gc_and_heap(void **state)
{
    (void)state;
    flinkgen_incident_t inc[] = {{FLINKGEN_GC, 0, 50, 80}};
    buf_t b0 = tm_body(0, 49, inc, 1), b1 = tm_body(0, 79, inc, 1), b2 = tm_body(0, 90, inc, 1),
          other = tm_body(1, 79, inc, 1);
    /* 30 ticks of 10 s: at least 30 x 3000 ms more young GC time, one full GC per 6 ticks */
    assert_true(get(&b1, GC("Young_Generation_Time"), "", "") - get(&b0, GC("Young_Generation_Time"), "", "") >= 90000);
    assert_true(get(&b0, GC("Old_Generation_Count"), "", "") == 0);
    assert_true(get(&b1, GC("Old_Generation_Count"), "", "") == 5);
    assert_true(get(&b2, GC("Old_Generation_Count"), "", "") == 5);    /* a counter: stays */
    assert_true(get(&other, GC("Old_Generation_Count"), "", "") == 0); /* clicks' TaskManager is fine */
    double max = get(&b1, "flink_taskmanager_Status_JVM_Memory_Heap_Max", "", "");
    assert_true(get(&b1, "flink_taskmanager_Status_JVM_Memory_Heap_Used", "", "") / max > 0.9);
    for (uint64_t t = 81; t < 87; t++) { /* a sawtooth again: GC frees it */
        buf_t b = tm_body(0, t, inc, 1);
        assert_true(get(&b, "flink_taskmanager_Status_JVM_Memory_Heap_Used", "", "") / max < 0.75);
        buf_free(&b);
    }
    buf_free(&b0), buf_free(&b1), buf_free(&b2), buf_free(&other);
}

#define JOB(x) "flink_jobmanager_job_" x
static void test_checkpoints_and_restarts(void **state)
{
    (void)state;
    flinkgen_incident_t inc[] = {
        {FLINKGEN_CHECKPOINT_SLOW, 0, 30, 40}, {FLINKGEN_STATE_LEAK, 1, 100, 400}, {FLINKGEN_RESTART, 0, 60, 61}};
    buf_t a = jm_body(29, inc, 3), s = jm_body(35, inc, 3), r = jm_body(60, inc, 3), l0 = jm_body(100, inc, 3),
          l1 = jm_body(400, inc, 3), l2 = jm_body(500, inc, 3);
    assert_true(get(&a, JOB("lastCheckpointDuration"), "job_name=\"orders\"", "") < 3000);
    assert_true(get(&s, JOB("lastCheckpointDuration"), "job_name=\"orders\"", "") > 20000);
    assert_true(get(&s, JOB("lastCheckpointDuration"), "job_name=\"clicks\"", "") < 3000);
    assert_true(get(&a, JOB("numRestarts"), "job_name=\"orders\"", "") == 0);
    assert_true(get(&r, JOB("numRestarts"), "job_name=\"orders\"", "") == 1);
    assert_true(get(&r, JOB("numberOfFailedCheckpoints"), "job_name=\"orders\"", "") == 1);
    assert_true(get(&r, JOB("uptime"), "job_name=\"orders\"", "") == 0);
    assert_true(get(&r, JOB("numRestarts"), "job_name=\"clicks\"", "") == 0);
    assert_true(get(&r, JOB("numberOfCompletedCheckpoints"), "job_name=\"orders\"", "") >
                get(&a, JOB("numberOfCompletedCheckpoints"), "job_name=\"orders\"", ""));
    double s0 = get(&l0, JOB("lastCheckpointSize"), "job_name=\"clicks\"", "");
    double s1 = get(&l1, JOB("lastCheckpointSize"), "job_name=\"clicks\"", "");
    assert_true(s1 / s0 > 1.5 && s1 / s0 < 1.7); /* 0.2% a tick for 300 ticks */
    assert_true(get(&l2, JOB("lastCheckpointSize"), "job_name=\"clicks\"", "") / s1 > 0.98); /* the state stays */
    buf_free(&a), buf_free(&s), buf_free(&r), buf_free(&l0), buf_free(&l1), buf_free(&l2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_determinism),
        cmocka_unit_test(test_lag_stall_surge),
        cmocka_unit_test(test_gc_and_heap),
        cmocka_unit_test(test_checkpoints_and_restarts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
