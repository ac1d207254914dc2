/*
 * push shape — recognises a push body that repeats an earlier body of its group with new values.
 *
 * A metrics reporter (Flink's push-gateway reporter, any Prometheus client's push) sends the same
 * series in the same order every interval; only the values change. After a text body was parsed
 * in full, push_shape_build cuts it at every sample's value: each piece is the bytes from the end
 * of the previous sample's line up to this sample's value (comments, HELP/TYPE lines, blank
 * lines, dropped samples, then the sample's name, labels and the blanks before its value), kept
 * as its length, with the index of the sample the value belongs to; one 128-bit hash covers the
 * bytes of all pieces. What follows the last sample's line is the last piece.
 *
 * push_shape_match reads a new body against those pieces: every piece must come back byte for
 * byte (same lengths, same hash over them all), each followed by a value token that runs to the end of its line
 * (no timestamp, no exemplar, no blank) and parses as the text parser parses values. Then parsing
 * the new body in full would give exactly the families of the first body (the parser's state at
 * every byte depends on the bytes before it, and only value tokens differ, which the parser only
 * converts), with these values — so the caller can reuse what it built from the first body and
 * skip parsing, label handling and checks. Anything else is a miss and the caller parses in full.
 *
 * Lengths and one hash instead of bytes keep ~4 bytes per series instead of the body's ~400.
 * Telling two bodies' pieces apart by their lengths and one 128-bit XXH3 over all of them is not
 * proof against a pusher who crafts a collision, but such a pusher can only misplace values among
 * its own group's series, which it could write directly anyway.
 */
#ifndef SLUICE_PUSH_SHAPE_H
#define SLUICE_PUSH_SHAPE_H

#include <stdbool.h>
#include <stddef.h>

#include "internal/expfmt/family.h"

typedef struct push_shape push_shape_t;

/* The shape of body[0:len] (as it was BEFORE the text parser changed it in place), given what
 * expfmt_parse_text_spans made of it (format fmt, TEXT or OPENMETRICS). NULL when the body
 * cannot be recognised this way (no spans, a timestamp or exemplar after a value, over 4 GiB)
 * or on OOM. Free with push_shape_free. */
push_shape_t *push_shape_build(const char *body, size_t len, expfmt_format_t fmt, const expfmt_result_t *parsed);
void push_shape_free(push_shape_t *s);

/* Number of values a matching body yields (the parsed body's sample count). */
size_t push_shape_nvalues(const push_shape_t *s);

/* True when body[0:len], of format fmt, repeats the shape: then values[k] (nvalues of them) is
 * the value of sample k as the parser would give it (before any _count/bucket truncation), in
 * the parsed body's order (families in order, samples within each). False otherwise; values is
 * then unspecified. */
bool push_shape_match(const push_shape_t *s, const char *body, size_t len, expfmt_format_t fmt, double *values);

#endif
