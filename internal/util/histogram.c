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

void histogram_write(const histogram_t *h, const char *name, const char *help, buf_t *out)
{
    buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i <= h->nbounds; i++) {
        cum += atomic_load_explicit(&h->counts[i], memory_order_relaxed);
        buf_printf(out, "%s_bucket{le=\"", name);
        if (i < h->nbounds)
            buf_put_float(out, h->bounds[i]);
        else
            buf_puts(out, "+Inf");
        buf_printf(out, "\"} %llu\n", (unsigned long long)cum);
    }
    uint64_t bits = atomic_load_explicit(&h->sum_bits, memory_order_relaxed);
    double sum;
    memcpy(&sum, &bits, sizeof(sum));
    buf_printf(out, "%s_sum ", name);
    buf_put_float(out, sum);
    buf_printf(out, "\n%s_count %llu\n", name, (unsigned long long)cum);
}
