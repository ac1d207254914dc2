/*
 * labels — label sets: the identity of a series (sorted by name, unique names, __name__ included).
 *
 * A label_t points at name/value strings it does not own; who owns them is said by whoever hands
 * out the labels_t (an arena for request-lifetime sets, the storage symbol table for stored
 * series). Sets are kept sorted by name (byte order, as Prometheus does) so equality and hashing
 * are a single pass.
 */
#ifndef SLUICE_LABELS_LABELS_H
#define SLUICE_LABELS_LABELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;
    const char *value;
} label_t;

typedef struct {
    label_t *v;
    size_t n;
} labels_t;

#define LABEL_METRIC_NAME "__name__"

/* Sorts by name in place. */
void labels_sort(labels_t *ls);
/* 0 if sorted with unique names; -1 otherwise. */
int labels_check_sorted_unique(const labels_t *ls);
/* Stable 64-bit hash of a sorted set (xxh3 over name\xff value\xff ...). */
uint64_t labels_hash(const labels_t *ls);
bool labels_equal(const labels_t *a, const labels_t *b);
/* Byte-order comparison of sorted sets, as Prometheus' labels.Compare. */
int labels_compare(const labels_t *a, const labels_t *b);
/* Value of `name` or NULL. */
const char *labels_get(const labels_t *ls, const char *name);
/* Bytes the names and values of ls take as NUL-terminated strings (what labels_pack writes). */
size_t labels_strings_size(const labels_t *ls);
/* Copies ls into out_v[0..ls->n), its strings packed one after another into `strings` (at least
 * labels_strings_size bytes). Returns the byte after the last one written. */
char *labels_pack(const labels_t *ls, label_t *out_v, char *strings);
/* Prometheus label name rule: [a-zA-Z_][a-zA-Z0-9_]*. */
bool labels_valid_name(const char *s, size_t n);
/* Metric name rule: [a-zA-Z_:][a-zA-Z0-9_:]*. */
bool labels_valid_metric_name(const char *s, size_t n);

#endif
