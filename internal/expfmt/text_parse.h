/*
 * expfmt text parser — Prometheus text exposition format 0.0.4, and OpenMetrics 1.0 text.
 *
 * 0.0.4 is parsed exactly as the Pushgateway 1.5 parser (prometheus/common expfmt.TextParser)
 * accepts and rejects it, including its error messages; see the top of text_parse.c for the
 * grammar and every quirk that is mirrored on purpose. OpenMetrics is a sluice extension (the
 * Pushgateway parses such bodies as 0.0.4); its limits are listed in text_parse.c as well.
 */
#ifndef SLUICE_EXPFMT_TEXT_PARSE_H
#define SLUICE_EXPFMT_TEXT_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include "internal/expfmt/family.h"

/*
 * Parses body[0:len] into *out. The body is MODIFIED in place (names and values get NUL
 * terminators and are unescaped where they lie) and must outlive *out, as must the arena `a`,
 * which receives every array. `lim` may be NULL for defaults. `openmetrics` selects OpenMetrics
 * 1.0 (Content-Type application/openmetrics-text). Returns 0, or EXPFMT_EPARSE / EXPFMT_ELIMIT /
 * EXPFMT_ENOMEM with the reason (1-based line number included) in err[0:errlen]. On error *out
 * is left empty.
 */
int expfmt_parse_text(char *body, size_t len, bool openmetrics, const expfmt_limits_t *lim, arena_t *a,
                      expfmt_result_t *out, char *err, size_t errlen);
/* The same, also filling out->spans (family.h): where each sample's line and value lie in the
 * body, for a caller that wants to recognise the body's lines again (push/shape.h). Bodies over
 * 4 GiB get no spans. */
int expfmt_parse_text_spans(char *body, size_t len, bool openmetrics, const expfmt_limits_t *lim, arena_t *a,
                            expfmt_result_t *out, char *err, size_t errlen);

#endif
