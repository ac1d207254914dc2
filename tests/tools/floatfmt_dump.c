/*
 * floatfmt_dump — reads float64 bit patterns (16 hex digits, one per line) on stdin and prints,
 * per line, the value as buf_put_float_go writes it in the layouts e, f and g, separated by
 * spaces. tests/integration/test_floatfmt_go.py holds the output against an independent oracle.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/buf.h"

int main(void)
{
    char line[64];
    buf_t b = BUF_INIT;
    while (fgets(line, sizeof(line), stdin)) {
        uint64_t x = strtoull(line, NULL, 16);
        double v;
        memcpy(&v, &x, sizeof(v));
        buf_reset(&b);
        buf_put_float_go(&b, v, 'e');
        buf_putc(&b, ' ');
        buf_put_float_go(&b, v, 'f');
        buf_putc(&b, ' ');
        buf_put_float_go(&b, v, 'g');
        buf_putc(&b, '\n');
        fwrite(b.data, 1, b.len, stdout);
    }
    buf_free(&b);
    return 0;
}
