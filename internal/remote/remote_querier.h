/*
 * remote_querier — remote stores (read_client.h) behind the querier interface (storage/querier.h),
 * so the fall-through (storage/querier_fallthrough.h) and the PromQL engine read them like local
 * data.
 *
 * select asks every client for [mint, maxt] (one after the other) and joins the answers: series
 * sorted by labels, a series several stores return is one series whose samples are the union by
 * timestamp (the first store listed wins a tie). Samples are clipped to [mint, maxt] (streamed
 * answers carry whole chunks) and re-encoded as XOR chunks of at most 120 samples.
 *
 * External labels: a label of a remote series equal to one of sluice's own --external-label pairs
 * is removed, as Prometheus' remote read client does: what sluice forwarded with its external
 * labels reads back as the series it holds, so the fall-through joins them instead of showing
 * both. (Unlike Prometheus, they are not added as matchers: a store shared by several sluices is
 * read whole.)
 *
 * A store that fails (unreachable, timeout, bad answer, too large an answer) is, by policy:
 *   warn: left out; the set carries a Prometheus-style warning naming the store and the error
 *         (querier_set_warnings), the other stores (and, in the fall-through, local data) answer;
 *   fail: the set's error (querier_set_error) with its kind: QUERIER_ERR_UNAVAILABLE for a store
 *         that could not be reached, timed out or answered 5xx/429, QUERIER_ERR_REMOTE otherwise.
 *
 * label_names / label_values select the matching series (all series when no matcher is given,
 * which reads their samples too: remote read has no label API) and collect their labels; a
 * failing store adds nothing in warn mode and fails the call in fail mode.
 */
#ifndef SLUICE_REMOTE_QUERIER_H
#define SLUICE_REMOTE_QUERIER_H

#include <stdbool.h>
#include <stddef.h>

#include "internal/remote/read_client.h"
#include "storage/querier.h"

typedef struct {
    remote_read_client_t *const *clients; /* borrowed; must outlive the querier */
    size_t nclients;
    bool fail_on_error;      /* fail policy (else warn) */
    const label_t *external; /* sluice's external labels, removed from remote series (borrowed) */
    size_t nexternal;
} remote_querier_opts_t;

/* NULL on OOM. Close with querier_close. */
querier_t *remote_querier_new(const remote_querier_opts_t *o);

#endif
