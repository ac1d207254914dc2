/*
 * expfmt protobuf parser — delimited io.prometheus.client.MetricFamily bodies (the Pushgateway's
 * `application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited`),
 * converted to the same families and component samples as the text parser produces.
 */
#ifndef SLUICE_EXPFMT_PROTO_PARSE_H
#define SLUICE_EXPFMT_PROTO_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "internal/expfmt/family.h"

/*
 * Parses body[0:len] (not modified; it need not outlive *out: every string is copied into `a`).
 * `lim` may be NULL for defaults. Returns 0, or EXPFMT_EPARSE / EXPFMT_ELIMIT / EXPFMT_ENOMEM
 * with the reason in err[0:errlen]; on error *out is left empty.
 */
int expfmt_parse_proto(const uint8_t *body, size_t len, const expfmt_limits_t *lim, arena_t *a, expfmt_result_t *out,
                       char *err, size_t errlen);

/* Appends one delimited record (uvarint length + msg[0:n]) to out[0:cap]; returns the bytes
 * written or 0 when it does not fit. For tests and the benchmark. */
size_t expfmt_proto_put_delimited(uint8_t *out, size_t cap, const uint8_t *msg, size_t n);

#endif
