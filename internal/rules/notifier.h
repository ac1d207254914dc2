/*
 * rules/notifier — sends alerts to Alertmanager (API v2: POST <url>/api/v2/alerts, a JSON array
 * of {labels, annotations, startsAt, endsAt, generatorURL}), like Prometheus' notifier:
 *
 *   rules evaluator --rules_notifier_send--> bounded queue --sender thread--> every Alertmanager
 *
 * - The queue holds at most `queue_capacity` alerts; when a batch does not fit, the oldest
 *   alerts are dropped and counted (sluice_notifications_dropped_total), as Prometheus does.
 * - The sender takes up to 64 alerts at a time and posts them to each Alertmanager in turn.
 *   Unlike Prometheus (which gives up at once), a failed post is retried with exponential backoff
 *   (backoff, 2x, 4x, ... at most max_retries times, each post bounded by timeout); a batch that
 *   no Alertmanager took is counted as dropped.
 * - External labels are added to every alert's labels (an alert's own label wins).
 * - HTTP goes through internal/net/httpc (http:// URLs only): one kept-alive connection per
 *   Alertmanager, reopened when the peer closed it; any 2xx answer is success, and for any other
 *   the status and the start of Alertmanager's reason are logged.
 */
#ifndef SLUICE_RULES_NOTIFIER_H
#define SLUICE_RULES_NOTIFIER_H

#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/rules/rules.h"
#include "internal/util/buf.h"

typedef struct rules_notifier rules_notifier_t;

typedef struct {
    const char *const *urls; /* Alertmanager base URLs ("http://host:9093" or with a path prefix) */
    size_t nurls;
    const labels_t *external_labels; /* may be NULL */
    size_t queue_capacity;           /* 0 = 10000 */
    int64_t timeout_ms;              /* per POST; 0 = 10s */
    int max_retries;                 /* retries after the first attempt; 0 = 3, < 0 = none */
    int64_t backoff_ms;              /* first retry delay; 0 = 500ms */
} rules_notifier_options_t;

/* Validates the URLs (http:// only) and starts the sender thread. NULL + err. */
rules_notifier_t *rules_notifier_new(const rules_notifier_options_t *o, char *err, size_t errlen);
/* Queues alerts (rules_hooks_t.send has this signature with ud = the notifier). Never blocks on
 * the network. */
void rules_notifier_send(void *notifier, const rules_alert_note_t *alerts, size_t n);
/* Stops the sender after one last attempt at what is queued (no retries); n may be NULL. */
void rules_notifier_free(rules_notifier_t *n);
/* sluice_notifications_{sent,errors,dropped}_total, sluice_notifications_queue_length/_capacity. */
void rules_notifier_write_metrics(rules_notifier_t *n, buf_t *out);
/* Renders one alert as Alertmanager API v2 JSON (exposed for tests). */
void rules_notifier_alert_json(const rules_alert_note_t *a, const labels_t *external_labels, buf_t *out);

#endif
