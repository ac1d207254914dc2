/*
 * control — the flow-control model of one Flink job: its state, the state machine that changes
 * it, validation of requested changes, and the JSON shapes the API, the audit log and the SSE
 * stream share. Pure code: no I/O, no locks (persistence and expiry are in control_store.h).
 *
 * A job (Flink `job_name`, TIS `pipeline`) that nobody has touched is RUNNING at version 0.
 *
 *                  pause                    rate-limit N
 *     +---------+ ------> +--------+      +--------------+
 *     | RUNNING |         | PAUSED | <--> | RATE_LIMITED |     every arrow is one change:
 *     +---------+ <------ +--------+      +--------------+     version + 1, one audit row,
 *          ^  \   resume      ^  \          ^       |          one SSE event.
 *          |   \              |   v         |       |
 *          |    +-------> +----------+ <----+-------+          any mode -> any mode is allowed
 *          +------------- | DRAINING |                         (PUT sets the whole state); a
 *              resume     +----------+                         change may carry `for`: at
 *                                                              expires_at the state it replaced
 *                                                              comes back (also one change).
 *
 * Transitions, and the function that performs each:
 *   request (PUT/pause/resume/rate-limit/drain) -> control_spec_parse_json / control_spec_*()
 *                                                  then control_state_apply()
 *   expiry (expires_at reached)                 -> control_state_revert()
 * control_state_check() is the executable statement of the invariants:
 *   - mode RATE_LIMITED  <=> rate_limit_per_second in [1, CONTROL_MAX_RATE]
 *   - drain matchers only in mode DRAINING (none = discharge everything)
 *   - expires_at != 0   <=> has_revert (the state to return to), and expires_at > updated_at
 *   - version == 0      <=> the job was never changed (and then it is RUNNING)
 *
 * Ownership: a control_state_t owns its strings and matcher array; control_state_free releases
 * them, control_state_copy deep-copies. Requests are control_spec_t (the part a client chooses).
 */
#ifndef SLUICE_CONTROL_CONTROL_H
#define SLUICE_CONTROL_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/util/buf.h"

#define CONTROL_MAX_JOB_LEN 256
#define CONTROL_MAX_RATE 1000000000LL /* records/s; above is a typo, not a limit */
#define CONTROL_MAX_MATCHERS 32
#define CONTROL_MAX_ATTR_LEN 128
#define CONTROL_MAX_REGEX_LEN 1024
#define CONTROL_MAX_REASON_LEN 1024
#define CONTROL_MAX_FOR_MS (366LL * 24 * 3600 * 1000)
#define CONTROL_MAX_BODY 65536

typedef enum {
    CONTROL_RUNNING = 0,
    CONTROL_PAUSED = 1,
    CONTROL_RATE_LIMITED = 2,
    CONTROL_DRAINING = 3,
} control_mode_t;
#define CONTROL_NMODES 4

typedef struct {
    char *attribute; /* record attribute, e.g. "table" */
    char *regex;     /* RE2/Go syntax, anchored by the author if wanted ("^tmp_") */
} control_match_t;

/* What a client chooses: the mode and its parameters. */
typedef struct {
    control_mode_t mode;
    int64_t rate_limit_per_second; /* only for RATE_LIMITED, else 0 */
    control_match_t *drain;        /* only for DRAINING; none = drop all records */
    size_t ndrain;
} control_spec_t;

typedef struct {
    control_spec_t spec;
    uint64_t version;
    int64_t updated_at_ms;
    char *updated_by;
    char *reason;
    int64_t expires_at_ms; /* 0 = no expiry */
    bool has_revert;       /* true iff expires_at_ms != 0 */
    control_spec_t revert; /* the state that comes back at expires_at */
} control_state_t;

/* A requested change: the spec plus who/why and an optional duration. */
typedef struct {
    control_spec_t spec;
    const char *reason; /* may be NULL */
    int64_t for_ms;     /* 0 = until changed again */
    bool check_version; /* optimistic concurrency: PUT with "version" */
    uint64_t expect_version;
} control_change_t;

const char *control_mode_name(control_mode_t m);
int control_mode_parse(const char *s, control_mode_t *out);
/* TIS controllerType for a mode: Paused, FloodDischargeRate, RateLimit, NoLimitParam. */
const char *control_mode_tis_type(control_mode_t m);

/* --- TIS ---------------------------------------------------------------------------------------
 * What TIS's rate-controller poll (PROTOCOLS.md §10, docs/control.md) is told for a state:
 *
 *   sluice state                   controllerType       pause  payloadParams
 *   running                        NoLimitParam         false  {"rateLimitPerSecond":0}
 *   paused                         Paused               true   {"rateLimitPerSecond":0}
 *   rate_limited N                 RateLimit            false  {"rateLimitPerSecond":N}
 *   draining, no matchers          FloodDischargeRate   false  {"rateLimitPerSecond":0}
 *   draining with matchers         SkipProcess          false  {"rateLimitPerSecond":0,
 *                                                               "drain":[{"attribute","regex"},..]}
 *
 * TIS's source function reads payloadParams.rateLimitPerSecond for RateLimit only; on
 * FloodDischargeRate it lifts the limit and discards every record; a SkipProcess broadcast it
 * leaves unapplied (the job keeps its previous setting). A drain that must spare the records its
 * matchers do not select therefore goes out as SkipProcess — never as FloodDischargeRate, which
 * would discard everything — with the matchers in payloadParams.drain for a consumer that can
 * apply them. */
const char *control_spec_tis_type(const control_spec_t *s);
/* Appends the poll's `bizresult` object for s: {"pause":..,"lastModified":<updated_at_ms>,
 * "controllerType":..,"payloadParams":{..}} (key order fixed, as above). */
void control_state_to_tis_json(const control_state_t *s, buf_t *out);

void control_spec_free(control_spec_t *s);
int control_spec_copy(control_spec_t *dst, const control_spec_t *src);
void control_state_init(control_state_t *s); /* RUNNING, version 0 */
void control_state_free(control_state_t *s);
int control_state_copy(control_state_t *dst, const control_state_t *src);
/* The invariants above; true when they hold. Meant for assert(). */
bool control_state_check(const control_state_t *s);

/* Job names: 1..CONTROL_MAX_JOB_LEN bytes, valid UTF-8, no control characters. 0 or -1 + err. */
int control_job_name_valid(const char *job, size_t len, char *err, size_t errlen);
/* Checks a spec (rate range, matcher shape, regexes compile). 0 or -1 + err naming the field. */
int control_spec_validate(const control_spec_t *s, char *err, size_t errlen);

/* --- requests --------------------------------------------------------------------------------- */
typedef enum {
    CONTROL_REQ_PUT,        /* whole state: {"mode":..., "rate_limit_per_second":..., "drain":[...]} */
    CONTROL_REQ_PAUSE,      /* {} */
    CONTROL_REQ_RESUME,     /* {} */
    CONTROL_REQ_RATE_LIMIT, /* {"per_second":N} */
    CONTROL_REQ_DRAIN,      /* {"match":[{"attribute":"table","regex":"^tmp_"}]} or {} */
} control_req_kind_t;

/* Parses and validates a JSON request body (may be empty for pause/resume/drain) into chg. Every
 * kind accepts "reason" and "for". Unknown fields, wrong types and bad values fail with an error
 * naming the field (written to err; the field's name is copied to field). On success
 * chg->spec is owned by chg (release with control_spec_free) and chg->reason points into
 * reason_buf (caller provides >= CONTROL_MAX_REASON_LEN + 1 bytes). */
int control_change_parse(control_req_kind_t kind, const char *body, size_t len, control_change_t *chg, char *reason_buf,
                         char *field, size_t fieldlen, char *err, size_t errlen);

/* --- transitions ------------------------------------------------------------------------------- */
/* Applies chg to cur, producing next (version + 1, updated_* set, expiry/revert set from
 * chg->for_ms: the spec being replaced is what comes back). next is initialised by the call. */
int control_state_apply(const control_state_t *cur, const control_change_t *chg, int64_t now_ms, const char *updated_by,
                        control_state_t *next);
/* The expiry transition: next = cur's revert spec, no expiry, version + 1, updated_by
 * "sluice (expiry)". Precondition: cur->has_revert. */
int control_state_revert(const control_state_t *cur, int64_t now_ms, control_state_t *next);

/* --- JSON ------------------------------------------------------------------------------------------ */
/* The API shape of a state:
 *   {"job":J,"mode":"paused","rate_limit_per_second":null,"drain":[],"version":3,
 *    "updated_at":"2024-05-01T03:00:00.000Z","updated_at_ms":1714532400000,"updated_by":"alice",
 *    "reason":"db maintenance","expires_at":null,"expires_at_ms":null,"revert_to":null} */
void control_state_to_json(const control_state_t *s, const char *job, buf_t *out);
/* Reads what control_state_to_json wrote (the store keeps states in this form). 0 or -1. */
int control_state_from_json(const char *json, size_t len, control_state_t *s, char *err, size_t errlen);
void control_spec_to_json(const control_spec_t *s, buf_t *out);
/* RFC 3339 UTC with milliseconds. */
void control_format_time(int64_t ms, char *out, size_t cap);

#endif
