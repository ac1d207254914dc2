/*
 * api/rules — the rules' HTTP surface, in Prometheus' shapes:
 *   GET  /api/v1/rules[?type=alert|record]  {"status":"success","data":{"groups":[...]}}
 *   GET  /api/v1/alerts                     {"status":"success","data":{"alerts":[...]}}
 *   POST|PUT /-/reload                      re-reads the rule files (and the closed-loop actions);
 *                                           200 on success, 500 "failed to reload config: ..." with
 *                                           the old rules still running otherwise
 * The reload runs on a short-lived thread (it parses files and waits for the evaluator to finish
 * its current group), and the parked request is answered on its worker afterwards.
 */
#ifndef SLUICE_API_RULES_H
#define SLUICE_API_RULES_H

#include <stdbool.h>

#include "api/server.h"
#include "internal/rules/rules.h"
#include "internal/util/buf.h"

typedef struct {
    api_server_t *srv;
    rules_manager_t *rules; /* must outlive the server */
    /* Reloads everything reloadable; returns 0 or the number of errors (text appended to errs).
     * Called on a background thread. */
    int (*reload)(void *ud, buf_t *errs);
    void *reload_ud;
} api_rules_options_t;

/* Registers the routes. Call once, before api_server_start. */
void api_rules_register(const api_rules_options_t *o);

#endif
