/*
 * tsdb_status — GET /api/v1/status/tsdb in Prometheus 2.42's shape: headStats plus the four
 * top-10 tables (series by metric name, label-value counts, memory by label name, series by
 * label pair), computed by the storage index on request.
 */
#include "api/tsdb_status.h"

#include <string.h>

#include "api/router.h"

static void tsdb_put_table(buf_t *b, const char *key, const index_stat_t *t, size_t n)
{
    buf_printf(b, ",\"%s\":[", key);
    for (size_t i = 0; i < n; i++) {
        if (i)
            buf_putc(b, ',');
        buf_puts(b, "{\"name\":");
        buf_put_json_string(b, t[i].name, strlen(t[i].name));
        buf_printf(b, ",\"value\":%llu}", (unsigned long long)t[i].value);
    }
    buf_putc(b, ']');
}

static void tsdb_status_handler(api_req_t *req, void *ud)
{
    storage_t *st = ud;
    if (!storage_ready(st)) {
        api_reply_prom_error(req, API_ERR_UNAVAILABLE, "storage is still recovering");
        return;
    }
    storage_tsdb_stats_t s;
    if (storage_tsdb_stats(st, 10, req->arena, &s) != 0) {
        api_reply_prom_error(req, API_ERR_INTERNAL, "cannot compute tsdb statistics");
        return;
    }
    buf_t b = BUF_INIT;
    bool empty = s.head.series == 0;
    uint64_t pairs = 0;
    for (size_t i = 0; i < s.index.n_values_by_name; i++)
        pairs += s.index.values_by_name[i].value;
    buf_printf(&b,
               "{\"headStats\":{\"numSeries\":%llu,\"numLabelPairs\":%llu,\"chunkCount\":%llu,"
               "\"minTime\":%lld,\"maxTime\":%lld}",
               (unsigned long long)s.head.series, (unsigned long long)pairs, (unsigned long long)s.head.chunks,
               (long long)(empty ? INT64_MAX : s.head.min_t), (long long)(empty ? INT64_MIN : s.head.max_t));
    tsdb_put_table(&b, "seriesCountByMetricName", s.index.series_by_metric, s.index.n_series_by_metric);
    tsdb_put_table(&b, "labelValueCountByLabelName", s.index.values_by_name, s.index.n_values_by_name);
    tsdb_put_table(&b, "memoryInBytesByLabelName", s.index.memory_by_name, s.index.n_memory_by_name);
    tsdb_put_table(&b, "seriesCountByLabelValuePair", s.index.series_by_pair, s.index.n_series_by_pair);
    buf_putc(&b, '}');
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

void api_tsdb_status_register_routes(storage_t *st, api_server_t *srv)
{
    api_route_add(srv, API_GET, "/api/v1/status/tsdb", "tsdb_status", tsdb_status_handler, st);
}
