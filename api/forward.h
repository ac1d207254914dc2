/*
 * forward — the remote-write sender: every sample sluice accepts (pushes, remote writes,
 * recording rules, staleness markers) is forwarded to one or more remote-write 1.0 receivers
 * (Mimir, Thanos Receive, Cortex, VictoriaMetrics, Prometheus), read back from sluice's own WAL.
 * Design, positions and the WAL hold are described at the top of forward.c.
 *
 * Lifecycle (the daemon's order):
 *   api_forward_new        before storage_recover (registers the WAL hold, loads saved positions)
 *   api_forward_start      after storage_recover (starts one reader + N shard threads per target)
 *   api_forward_stop       after the HTTP server and the rules stopped, BEFORE storage_close:
 *                          saves positions; the final snapshot then keeps what is unsent
 *   api_forward_free       after storage_close
 *
 * Target spec (one --remote-write.url value): the URL, then optional space-separated options:
 *   name=<remote_name>              label in self-metrics (default: 6 hex digits of the URL hash)
 *   header=<Name>:<value>           extra request header (repeatable)
 *   basic-auth-username=<user>      with basic-auth-password-file=<path> (or basic-auth-password=)
 *   bearer-token-file=<path>        re-read for each request (rotation works)
 *   retry-on-429=true|false         overrides --remote-write.retry-on-http-429
 *   tls-ca-file=, tls-cert-file=, tls-key-file=, tls-server-name=, tls-insecure-skip-verify=
 *                                   override the --remote-write.tls-* defaults (https:// only)
 *
 * https:// targets speak TLS (internal/net/httpc): the server certificate is verified against
 * the CA file (default: the system store), including its name; a client certificate gives mTLS.
 */
#ifndef SLUICE_API_FORWARD_H
#define SLUICE_API_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/net/tls.h"
#include "internal/util/buf.h"
#include "storage/storage.h"

typedef struct api_forward api_forward_t;

typedef struct {
    storage_t *storage;
    const char *data_dir;          /* positions live in <data_dir>/forward/ */
    const char *targets;           /* '\n'-joined target specs (see above); "" = none */
    const char *external_labels;   /* '\n'-joined name=value; added unless a series has the label */
    uint32_t shards;               /* concurrent senders per target; 0 = 4 */
    uint32_t max_samples_per_send; /* 0 = 2000 */
    int64_t timeout_ms;            /* one request; 0 = 30 s */
    int64_t min_backoff_ms;        /* 0 = 30 ms */
    int64_t max_backoff_ms;        /* 0 = 5 s */
    bool retry_on_429;             /* default for targets that do not say */
    int64_t wal_max_hold_ms;       /* keep unsent WAL at most this long (by segment age); <= 0: forever */
    int64_t poll_interval_ms;      /* how often an idle reader looks for new WAL records; 0 = 100 ms */
    tls_client_options_t tls;      /* https:// targets' TLS defaults (--remote-write.tls-*) */
} api_forward_options_t;

/* Parses the specs and registers the WAL hold. Returns NULL with a message on a bad spec or flag,
 * or when targets is empty (err[0] == 0 then: nothing to do). */
api_forward_t *api_forward_new(const api_forward_options_t *o, char *err, size_t errlen);
/* Starts the threads. 0 or -1 with a message. */
int api_forward_start(api_forward_t *f, char *err, size_t errlen);
/* Stops the threads (an in-flight request is abandoned, resent after restart) and saves every
 * target's position. Safe to call twice or on a never-started sender. */
void api_forward_stop(api_forward_t *f);
void api_forward_free(api_forward_t *f);

/* sluice_remote_storage_* self-metrics (the receiver owns sluice_remote_write_*), Prometheus text format. */
void api_forward_write_metrics(void *ud, buf_t *out);

/* ---- pieces exposed for unit tests ---------------------------------------------------------- */

/* Splits one target spec; fills *url (malloc'd) and option strings into out_opts (malloc'd,
 * '\n'-joined "key=value"). 0 or -1 with a message. */
int api_forward__parse_spec(const char *spec, char **url, char **opts, char *err, size_t errlen);
/* Backoff after `attempt` failures (0-based): min * 2^attempt, capped at max. */
int64_t api_forward__backoff_ms(int64_t min_ms, int64_t max_ms, uint32_t attempt);
/* What to do with an HTTP outcome: 0 = done (2xx), 1 = retry, -1 = drop (counted as failed). */
int api_forward__classify(int status, bool retry_on_429);

#endif
