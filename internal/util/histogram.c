/* histogram — lock-free Prometheus histogram; see histogram.h. */
#include "internal/util/histogram.h"

#include <math.h>
#include <string.h>

int histogram_init(histogram_t *h, const double *bounds, size_t nbounds)
{
    if (nbounds > HISTOGRAM_MAX_BOUNDS)
        return -1;
    for (size_t i = 0; i < nbounds; i++)
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return -1;
    memset(h, 0, sizeof(*h));
    if (nbounds)
        memcpy(h->bounds, bounds, nbounds * sizeof(*bounds));
    h->nbounds = nbounds;
    return 0;
}

void histogram_observe(histogram_t *h, double v)
{
    size_t i = 0;
    while (i < h->nbounds && !(v <= h->bounds[i])) /* NaN compares false: it lands in +Inf */
        i++;
    atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
    uint64_t old = atomic_load_explicit(&h->sum_bits, memory_order_relaxed), upd;
    do {
        double s;
        memcpy(&s, &old, sizeof(s));
        s += v;
        memcpy(&upd, &s, sizeof(upd));
    } while (
        !atomic_compare_exchange_weak_explicit(&h->sum_bits, &old, upd, memory_order_relaxed, memory_order_relaxed));
}

static void histogram_put_bucket(buf_t *out, const char *name, const char *labels, double le, uint64_t cum)
{
    buf_puts(out, name);
    buf_puts(out, "_bucket{");
    if (labels && *labels) {
        buf_puts(out, labels);
        buf_putc(out, ',');
    }
    buf_puts(out, "le=\"");
    if (isinf(le))
        buf_puts(out, "+Inf");
    else
        buf_put_float(out, le);
    buf_printf(out, "\"} %llu\n", (unsigned long long)cum);
}

void histogram_write(const histogram_t *h, const char *name, const char *help, const char *labels, int with_header,
                     buf_t *out)
{
    if (with_header)
        buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i <= h->nbounds; i++) {
        cum += atomic_load_explicit(&h->counts[i], memory_order_relaxed);
        histogram_put_bucket(out, name, labels, i < h->nbounds ? h->bounds[i] : INFINITY, cum);
    }
    uint64_t bits = atomic_load_explicit(&h->sum_bits, memory_order_relaxed);
    double sum;
    memcpy(&sum, &bits, sizeof(sum));
    const char *lo = labels && *labels ? "{" : "", *lc = labels && *labels ? "}" : "";
    buf_printf(out, "%s_sum%s%s%s ", name, lo, labels && *labels ? labels : "", lc);
    buf_put_float(out, sum);
    buf_printf(out, "\n%s_count%s%s%s %llu\n", name, lo, labels && *labels ? labels : "", lc, (unsigned long long)cum);
}
