/*
 * api/control — the flow-control HTTP API: REST reads and changes, long-polls, the SSE stream of
 * changes, the TIS-compatible poll, auth, and the control self-metrics. The model is in
 * internal/control/control.h, persistence in internal/control/store.h; the endpoints are
 * documented in api/openapi.yaml and docs/control.md. One handle, made by main.c, like every API
 * module.
 */
#ifndef SLUICE_API_CONTROL_H
#define SLUICE_API_CONTROL_H

#include <stdbool.h>
#include <stddef.h>

#include "api/router.h"
#include "api/server.h"
#include "internal/util/buf.h"
#include "internal/control/control.h"

typedef struct {
    api_server_t *srv;        /* started later; parked requests live on its workers */
    const char *storage_path; /* the data directory (exists, locked) */
    const char *token_file;   /* NULL or "": mutations only from 127.0.0.1 / ::1 */
    bool read_auth;           /* reads need a token (or loopback) too */
} api_control_options_t;

typedef struct api_control api_control_t;

/* Opens the control store (reverting changes that expired while sluice was down), loads the token
 * file and starts the control thread (which owns every SQLite write and the expiry clock). Call
 * once, before api_server_start. NULL + err. opt is copied; its strings are not kept. */
api_control_t *api_control_new(const api_control_options_t *opt, char *err, size_t errlen);
/* Registers the routes, the metrics collector and the server's shutdown hook, each with ctl as
 * its ud: free ctl only after the server is destroyed. */
void api_control_register_routes(api_control_t *ctl, api_server_t *srv);
/* After api_server_stop: stops the control thread and closes the store. Idempotent; NULL is
 * fine. */
void api_control_shutdown(api_control_t *ctl);
/* Shuts down if not yet done and frees the handle; after api_server_destroy. NULL is fine. */
void api_control_free(api_control_t *ctl);
/* Appends a job's current control state as JSON (the shape GET /api/v1/control/jobs/{job}
 * returns; "running" at version 0 for a job never changed). ud is the api_control_t (the
 * signature fits api_flow_options_t.control_json with control_ud); appends nothing when it is
 * NULL or shut down. Thread-safe. */
void api_control_state_json(const char *job, buf_t *out, void *ud);

/* For subsystems inside the daemon (the rules' closed loop). A job's current state (RUNNING at
 * version 0 if never changed): 0 or -1 (NULL, shut down, OOM). Release with control_state_free. */
int api_control_get_state(api_control_t *ctl, const char *job, control_state_t *out);
/* Applies a change exactly like a REST change (validated, durable, audited with updated_by,
 * fanned out to long-polls and streams) through the control thread, and waits for it. chg is
 * copied. 0 with the job's new version in *version (may be NULL); 1 when chg->check_version did
 * not match the current version; -1 + err. Must not be called after api_control_shutdown. */
int api_control_apply(api_control_t *ctl, const char *job, const control_change_t *chg, const char *updated_by,
                      uint64_t *version, char *err, size_t errlen);

/* For other endpoints that change state (POST /-/reload): the checks a flow-control change gets —
 * refuses browser cross-site requests (foreign Origin or Sec-Fetch-Site, a body that is not
 * application/json) and requires a token (--web.control-token-file) or, without one, a loopback
 * peer. 0 with the caller's name in who, or -1 after replying 403/401/415. */
int api_control_authorize_change(api_control_t *ctl, api_req_t *req, char *who, size_t wholen);

/* The same checks for reads (--web.control-read-auth): 0 with who set, or -1 after replying. */
int api_control_authorize_read(api_control_t *ctl, api_req_t *req, char *who, size_t wholen);

/* Requests on /api/v1/control/jobs/{job}[/{action}] that another module serves (the expected
 * jobs of api/availability): called with the decoded, validated job name before flow control
 * looks at the request; returns true if it handled (replied to) the request. Set before the
 * server starts. */
typedef bool (*api_control_job_hook_fn)(api_req_t *req, const char *job, const char *action, void *ud);
void api_control_set_job_hook(api_control_t *ctl, api_control_job_hook_fn fn, void *ud);

/* Parses a token file (one `name:token` per line, `#` comments, blank lines ignored). Exposed for
 * tests. Returns the number of tokens, or -1 + err (naming the line). names/tokens are malloc'd
 * arrays of malloc'd strings; free with api_control_free_tokens. */
int api_control_load_tokens(const char *path, char ***names, char ***tokens, char *err, size_t errlen);
void api_control_free_tokens(char **names, char **tokens, int n);

#endif
