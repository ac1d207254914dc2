/* Unit tests for internal/util/metrics.c: the collector registry rendered at once and in pieces
 * (GET /metrics), stream collectors begun and ended exactly once, and /-/metrics without the
 * pushed ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/metrics.h"

static void plain_a(void *ud, buf_t *out)
{
    (void)ud;
    buf_puts(out, "# TYPE a gauge\na 1\n");
}

static void plain_b(void *ud, buf_t *out)
{
    (void)ud;
    buf_puts(out, "# TYPE b gauge\nb 2\n");
}

/* A stream collector of `lines` numbered lines; counts its live handles. */
typedef struct {
    int lines;
    int begun, ended;
} fake_t;

typedef struct {
    fake_t *f;
    int next;
} fake_handle_t;

static void *fake_begin(void *ud)
{
    fake_t *f = ud;
    fake_handle_t *h = calloc(1, sizeof(*h));
    h->f = f;
    f->begun++;
    return h;
}

static bool fake_next(void *hp, buf_t *out, size_t max_bytes)
{
    fake_handle_t *h = hp;
    size_t start = out->len;
    while (h->next < h->f->lines && out->len - start < max_bytes)
        buf_printf(out, "pushed{n=\"%d\"} %d\n", h->next, h->next), h->next++;
    return h->next < h->f->lines;
}

static void fake_end(void *hp)
{
    fake_handle_t *h = hp;
    h->f->ended++;
    free(h);
}

static const metrics_stream_ops_t fake_ops = {fake_begin, fake_next, fake_end};

static void test_pieces_equal_one_shot(void **state)
{
    (void)state;
    fake_t f = {.lines = 500};
    metrics_unregister_all();
    assert_int_equal(metrics_register("a", plain_a, NULL), 0);
    assert_int_equal(metrics_register_pushed_stream("pushed", &fake_ops, &f), 0);
    assert_int_equal(metrics_register("b", plain_b, NULL), 0);
    buf_t want = BUF_INIT;
    metrics_write_all(&want);
    assert_int_equal(f.begun, 1);
    assert_int_equal(f.ended, 1);
    buf_putc(&want, '\0');
    assert_true(strncmp(want.data, "# TYPE a gauge\na 1\npushed{n=\"0\"} 0\n", 35) == 0);
    assert_non_null(strstr(want.data, "pushed{n=\"499\"} 499\n# TYPE b gauge\nb 2\n"));
    want.len--;

    static const size_t pieces[] = {1, 100, 4096, SIZE_MAX};
    for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
        metrics_render_t *h = metrics_render_begin();
        assert_non_null(h);
        buf_t got = BUF_INIT;
        int n = 0;
        bool more;
        do {
            size_t before = got.len;
            more = metrics_render_next(h, &got, pieces[i]);
            if (more)
                assert_true(got.len - before >= pieces[i]);
            n++;
        } while (more);
        metrics_render_end(h);
        assert_int_equal(got.len, want.len);
        assert_memory_equal(got.data, want.data, want.len);
        if (pieces[i] == 100)
            assert_true(n > 50);
        buf_free(&got);
    }
    assert_int_equal(f.begun, 1 + 4);
    assert_int_equal(f.ended, f.begun);

    /* Ended halfway: the stream collector's handle is ended too. */
    metrics_render_t *h = metrics_render_begin();
    buf_t got = BUF_INIT;
    assert_true(metrics_render_next(h, &got, 64));
    metrics_render_end(h);
    assert_int_equal(f.ended, f.begun);
    /* /-/metrics: the plain collectors only, the stream one not even begun. */
    int begun = f.begun;
    buf_reset(&got);
    metrics_write_self(&got);
    buf_putc(&got, '\0');
    assert_string_equal(got.data, "# TYPE a gauge\na 1\n# TYPE b gauge\nb 2\n");
    assert_int_equal(f.begun, begun);
    buf_free(&got);
    buf_free(&want);
    metrics_unregister_all();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_equal_one_shot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
