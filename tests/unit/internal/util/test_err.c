/* Unit tests for internal/util/err.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "internal/util/err.h"

static void test_err_setf(void **state)
{
    char err[16];
    err_setf(err, sizeof(err), "wal: %s %d", "segment", 7);
    assert_string_equal(err, "wal: segment 7");
    /* cut to the buffer, still terminated */
    err_setf(err, sizeof(err), "%s", "a message longer than sixteen bytes");
    assert_int_equal(strlen(err), sizeof(err) - 1);
    assert_memory_equal(err, "a message longer", sizeof(err) - 1);
    /* no buffer, or no room: nothing written, no crash */
    err_setf(NULL, 64, "ignored %d", 1);
    memcpy(err, "keep", 5);
    err_setf(err, 0, "ignored %d", 2);
    assert_string_equal(err, "keep");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_setf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
