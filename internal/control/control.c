/*
 * control — state machine, validation and JSON of a job's flow-control state; see control.h for
 * the diagram and the invariants. Request bodies are parsed with jansson; every error names the
 * offending field so an operator at 3 a.m. sees what to fix.
 */
#include "internal/control/control.h"

#include <assert.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal/util/parse.h"
#include "internal/util/regex.h"
#include "internal/util/utf8.h"

static const char *const control_mode_names[CONTROL_NMODES] = {"running", "paused", "rate_limited", "draining"};

const char *control_mode_name(control_mode_t m)
{
    return (unsigned)m < CONTROL_NMODES ? control_mode_names[m] : "unknown";
}

int control_mode_parse(const char *s, control_mode_t *out)
{
    for (int i = 0; i < CONTROL_NMODES; i++)
        if (strcmp(s, control_mode_names[i]) == 0) {
            *out = (control_mode_t)i;
            return 0;
        }
    return -1;
}

const char *control_mode_tis_type(control_mode_t m)
{
    switch (m) {
    case CONTROL_PAUSED: return "Paused";
    case CONTROL_DRAINING: return "FloodDischargeRate";
    case CONTROL_RATE_LIMITED: return "RateLimit";
    case CONTROL_RUNNING: break;
    }
    return "NoLimitParam";
}

const char *control_spec_tis_type(const control_spec_t *s)
{
    if (s->mode == CONTROL_DRAINING && s->ndrain)
        return "SkipProcess";
    return control_mode_tis_type(s->mode);
}

/* --- lifetime ---------------------------------------------------------------------------------- */

void control_spec_free(control_spec_t *s)
{
    for (size_t i = 0; i < s->ndrain; i++) {
        free(s->drain[i].attribute);
        free(s->drain[i].regex);
    }
    free(s->drain);
    memset(s, 0, sizeof(*s));
}

int control_spec_copy(control_spec_t *dst, const control_spec_t *src)
{
    *dst = *src;
    dst->drain = NULL;
    dst->ndrain = 0;
    if (src->ndrain) {
        dst->drain = calloc(src->ndrain, sizeof(*dst->drain));
        if (!dst->drain)
            return -1;
        for (size_t i = 0; i < src->ndrain; i++) {
            dst->drain[i].attribute = strdup(src->drain[i].attribute);
            dst->drain[i].regex = strdup(src->drain[i].regex);
            dst->ndrain++;
            if (!dst->drain[i].attribute || !dst->drain[i].regex) {
                control_spec_free(dst);
                return -1;
            }
        }
    }
    return 0;
}

void control_state_init(control_state_t *s)
{
    memset(s, 0, sizeof(*s));
    s->spec.mode = CONTROL_RUNNING;
}

void control_state_free(control_state_t *s)
{
    control_spec_free(&s->spec);
    control_spec_free(&s->revert);
    free(s->updated_by);
    free(s->reason);
    control_state_init(s);
}

static char *control_strdup0(const char *s)
{
    return s ? strdup(s) : NULL;
}

int control_state_copy(control_state_t *dst, const control_state_t *src)
{
    control_state_init(dst);
    dst->version = src->version;
    dst->updated_at_ms = src->updated_at_ms;
    dst->expires_at_ms = src->expires_at_ms;
    dst->has_revert = src->has_revert;
    dst->updated_by = control_strdup0(src->updated_by);
    dst->reason = control_strdup0(src->reason);
    if ((src->updated_by && !dst->updated_by) || (src->reason && !dst->reason) ||
        control_spec_copy(&dst->spec, &src->spec) != 0 || control_spec_copy(&dst->revert, &src->revert) != 0) {
        control_state_free(dst);
        return -1;
    }
    return 0;
}

static bool control_spec_check(const control_spec_t *s)
{
    if ((unsigned)s->mode >= CONTROL_NMODES)
        return false;
    if ((s->mode == CONTROL_RATE_LIMITED) != (s->rate_limit_per_second > 0))
        return false;
    if (s->rate_limit_per_second < 0 || s->rate_limit_per_second > CONTROL_MAX_RATE)
        return false;
    if (s->ndrain && s->mode != CONTROL_DRAINING)
        return false;
    return (s->ndrain == 0) == (s->drain == NULL);
}

bool control_state_check(const control_state_t *s)
{
    if (!control_spec_check(&s->spec))
        return false;
    if ((s->expires_at_ms != 0) != s->has_revert)
        return false;
    if (s->has_revert && (!control_spec_check(&s->revert) || s->expires_at_ms <= s->updated_at_ms))
        return false;
    if (!s->has_revert && (s->revert.ndrain || s->revert.mode != CONTROL_RUNNING))
        return false;
    if (s->version == 0 && s->spec.mode != CONTROL_RUNNING)
        return false;
    return true;
}

/* --- validation ----------------------------------------------------------------------------------- */

/* Checks one user-supplied string: length, UTF-8, no control characters. */
static int control_text_valid(const char *field, const char *s, size_t len, size_t max, bool allow_empty, char *err,
                              size_t errlen)
{
    if (len == 0 && !allow_empty) {
        snprintf(err, errlen, "%s must not be empty", field);
        return -1;
    }
    if (len > max) {
        snprintf(err, errlen, "%s is too long (%zu bytes, at most %zu)", field, len, max);
        return -1;
    }
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        if (p[i] < 0x20 || p[i] == 0x7f) {
            snprintf(err, errlen, "%s contains a control character at byte %zu", field, i);
            return -1;
        }
        size_t n = utf8_decode(s + i, len - i, NULL);
        if (n == 0) {
            snprintf(err, errlen, "%s is not valid UTF-8 (byte %zu)", field, i);
            return -1;
        }
        i += n;
    }
    return 0;
}

int control_job_name_valid(const char *job, size_t len, char *err, size_t errlen)
{
    return control_text_valid("job", job, len, CONTROL_MAX_JOB_LEN, false, err, errlen);
}

/* Drain patterns go to the job (unanchored, as written); they are checked with sluice's one regex
 * engine, so a pattern is accepted only if Go/RE2 syntax accepts it. */
static int control_regex_valid(const char *re, char *err, size_t errlen, size_t idx)
{
    regex_prog_t *c;
    char msg[256];
    if (regex_compile(re, 0, &c, msg, sizeof(msg)) != REGEX_OK) {
        snprintf(err, errlen, "match[%zu].regex is not a valid regular expression: %s", idx, msg);
        return -1;
    }
    regex_free(c);
    return 0;
}

int control_spec_validate(const control_spec_t *s, char *err, size_t errlen)
{
    if ((unsigned)s->mode >= CONTROL_NMODES) {
        snprintf(err, errlen, "mode must be one of running, paused, rate_limited, draining");
        return -1;
    }
    if (s->mode == CONTROL_RATE_LIMITED) {
        if (s->rate_limit_per_second <= 0 || s->rate_limit_per_second > CONTROL_MAX_RATE) {
            snprintf(err, errlen, "rate_limit_per_second must be an integer between 1 and %lld", CONTROL_MAX_RATE);
            return -1;
        }
    } else if (s->rate_limit_per_second != 0) {
        snprintf(err, errlen, "rate_limit_per_second is only allowed with mode rate_limited");
        return -1;
    }
    if (s->ndrain && s->mode != CONTROL_DRAINING) {
        snprintf(err, errlen, "drain is only allowed with mode draining");
        return -1;
    }
    if (s->ndrain > CONTROL_MAX_MATCHERS) {
        snprintf(err, errlen, "match has %zu matchers, at most %d are allowed", s->ndrain, CONTROL_MAX_MATCHERS);
        return -1;
    }
    for (size_t i = 0; i < s->ndrain; i++) {
        char field[48];
        snprintf(field, sizeof(field), "match[%zu].attribute", i);
        if (control_text_valid(field, s->drain[i].attribute, strlen(s->drain[i].attribute), CONTROL_MAX_ATTR_LEN, false,
                               err, errlen) != 0)
            return -1;
        snprintf(field, sizeof(field), "match[%zu].regex", i);
        if (control_text_valid(field, s->drain[i].regex, strlen(s->drain[i].regex), CONTROL_MAX_REGEX_LEN, false, err,
                               errlen) != 0)
            return -1;
        if (control_regex_valid(s->drain[i].regex, err, errlen, i) != 0)
            return -1;
    }
    return 0;
}

/* --- request parsing ---------------------------------------------------------------------------------- */

/* Reads a matcher list: [{"attribute":A,"regex":R}, ...] or the short form ["table=^tmp_"]. */
static int control_parse_matchers(json_t *arr, control_spec_t *spec, char *err, size_t errlen)
{
    if (!json_is_array(arr)) {
        snprintf(err, errlen, "match must be an array of {\"attribute\":...,\"regex\":...}");
        return -1;
    }
    size_t n = json_array_size(arr);
    if (n > CONTROL_MAX_MATCHERS) {
        snprintf(err, errlen, "match has %zu matchers, at most %d are allowed", n, CONTROL_MAX_MATCHERS);
        return -1;
    }
    if (n == 0)
        return 0;
    spec->drain = calloc(n, sizeof(*spec->drain));
    if (!spec->drain) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(arr, i);
        const char *attr = NULL, *re = NULL;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            const char *eq = strchr(s, '=');
            if (!eq || eq == s) {
                snprintf(err, errlen, "match[%zu] must be \"attribute=regex\" or an object", i);
                return -1;
            }
            spec->drain[i].attribute = strndup(s, (size_t)(eq - s));
            spec->drain[i].regex = strdup(eq + 1);
        } else if (json_is_object(m)) {
            const char *key;
            json_t *v;
            json_object_foreach(m, key, v)
            {
                if (strcmp(key, "attribute") == 0 && json_is_string(v)) {
                    attr = json_string_value(v);
                } else if (strcmp(key, "regex") == 0 && json_is_string(v)) {
                    re = json_string_value(v);
                } else {
                    bool known = strcmp(key, "attribute") == 0 || strcmp(key, "regex") == 0;
                    snprintf(err, errlen, known ? "match[%zu].%s must be a string" : "match[%zu]: unknown field \"%s\"",
                             i, key);
                    return -1;
                }
            }
            if (!attr || !re) {
                snprintf(err, errlen, "match[%zu] needs both \"attribute\" and \"regex\"", i);
                return -1;
            }
            spec->drain[i].attribute = strdup(attr);
            spec->drain[i].regex = strdup(re);
        } else {
            snprintf(err, errlen, "match[%zu] must be an object {\"attribute\":...,\"regex\":...}", i);
            return -1;
        }
        spec->ndrain++;
        if (!spec->drain[i].attribute || !spec->drain[i].regex) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* An integer rate given as a JSON integer (or a float with no fraction). */
static int control_json_rate(json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d >= 1 && d <= (double)CONTROL_MAX_RATE && d == (double)(int64_t)d) {
            *out = (int64_t)d;
            return 0;
        }
        *out = -1; /* out of range or fractional: reported as a range error */
        return 0;
    }
    return -1;
}

int control_change_parse(control_req_kind_t kind, const char *body, size_t len, control_change_t *chg, char *reason_buf,
                         char *field, size_t fieldlen, char *err, size_t errlen)
{
#define SETF(x) snprintf(field, fieldlen, "%s", (x))
    memset(chg, 0, sizeof(*chg));
    SETF("body");
    if (len > CONTROL_MAX_BODY) {
        snprintf(err, errlen, "body is too large (%zu bytes, at most %d)", len, CONTROL_MAX_BODY);
        return -1;
    }
    json_t *root = NULL;
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
        i++;
    if (i < len) {
        json_error_t je;
        root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
        if (!root) {
            snprintf(err, errlen, "body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
            return -1;
        }
        if (!json_is_object(root)) {
            snprintf(err, errlen, "body must be a JSON object");
            json_decref(root);
            return -1;
        }
    } else if (kind == CONTROL_REQ_PUT || kind == CONTROL_REQ_RATE_LIMIT) {
        snprintf(err, errlen,
                 kind == CONTROL_REQ_PUT ? "body must be a JSON object with \"mode\""
                                         : "body must be a JSON object with \"per_second\"");
        return -1;
    }

    int rc = -1;
    bool have_mode = false, have_rate = false, have_match = false;
    json_t *match = NULL;
    switch (kind) {
    case CONTROL_REQ_PAUSE:
        chg->spec.mode = CONTROL_PAUSED;
        have_mode = true;
        break;
    case CONTROL_REQ_RESUME:
        chg->spec.mode = CONTROL_RUNNING;
        have_mode = true;
        break;
    case CONTROL_REQ_RATE_LIMIT:
        chg->spec.mode = CONTROL_RATE_LIMITED;
        have_mode = true;
        break;
    case CONTROL_REQ_DRAIN:
        chg->spec.mode = CONTROL_DRAINING;
        have_mode = true;
        break;
    case CONTROL_REQ_PUT: break;
    }

    const char *key;
    json_t *v;
    if (root) {
        json_object_foreach(root, key, v)
        {
            SETF("");
            if (strcmp(key, "reason") == 0) {
                SETF("reason");
                if (!json_is_string(v) && !json_is_null(v)) {
                    snprintf(err, errlen, "reason must be a string");
                    goto out;
                }
                if (json_is_string(v)) {
                    const char *s = json_string_value(v);
                    size_t sl = json_string_length(v);
                    if (strlen(s) != sl) {
                        snprintf(err, errlen, "reason contains a NUL character");
                        goto out;
                    }
                    if (control_text_valid("reason", s, sl, CONTROL_MAX_REASON_LEN, true, err, errlen) != 0)
                        goto out;
                    memcpy(reason_buf, s, sl + 1);
                    chg->reason = reason_buf;
                }
            } else if (strcmp(key, "for") == 0) {
                SETF("for");
                int64_t ms = 0;
                if (json_is_string(v)) {
                    if (parse_duration_ms(json_string_value(v), &ms) != 0) {
                        snprintf(err, errlen, "for must be a duration like \"10m\" or \"1h30m\"");
                        goto out;
                    }
                } else if (!json_is_null(v)) {
                    snprintf(err, errlen, "for must be a duration string like \"10m\"");
                    goto out;
                }
                if (json_is_string(v) && (ms <= 0 || ms > CONTROL_MAX_FOR_MS)) {
                    snprintf(err, errlen, "for must be greater than 0 and at most 366d");
                    goto out;
                }
                chg->for_ms = ms;
            } else if (kind == CONTROL_REQ_PUT && strcmp(key, "mode") == 0) {
                SETF("mode");
                if (!json_is_string(v) || control_mode_parse(json_string_value(v), &chg->spec.mode) != 0) {
                    snprintf(err, errlen, "mode must be one of running, paused, rate_limited, draining");
                    goto out;
                }
                have_mode = true;
            } else if ((kind == CONTROL_REQ_PUT && strcmp(key, "rate_limit_per_second") == 0) ||
                       (kind == CONTROL_REQ_RATE_LIMIT && strcmp(key, "per_second") == 0)) {
                SETF(kind == CONTROL_REQ_PUT ? "rate_limit_per_second" : "per_second");
                if (json_is_null(v) && kind == CONTROL_REQ_PUT)
                    continue;
                int64_t r;
                if (control_json_rate(v, &r) != 0) {
                    snprintf(err, errlen, "%s must be an integer number of records per second", field);
                    goto out;
                }
                if (r <= 0 || r > CONTROL_MAX_RATE) {
                    snprintf(err, errlen, "%s must be an integer between 1 and %lld", field, CONTROL_MAX_RATE);
                    goto out;
                }
                chg->spec.rate_limit_per_second = r;
                have_rate = true;
            } else if ((kind == CONTROL_REQ_PUT && strcmp(key, "drain") == 0) ||
                       (kind == CONTROL_REQ_DRAIN && strcmp(key, "match") == 0)) {
                SETF(kind == CONTROL_REQ_PUT ? "drain" : "match");
                if (json_is_null(v))
                    continue;
                match = v;
                have_match = true;
            } else if (kind == CONTROL_REQ_PUT && strcmp(key, "version") == 0) {
                SETF("version");
                if (!json_is_integer(v) || json_integer_value(v) < 0) {
                    snprintf(err, errlen, "version must be a non-negative integer");
                    goto out;
                }
                chg->check_version = true;
                chg->expect_version = (uint64_t)json_integer_value(v);
            } else if (kind == CONTROL_REQ_PUT &&
                       (strcmp(key, "job") == 0 || strcmp(key, "updated_at") == 0 ||
                        strcmp(key, "updated_at_ms") == 0 || strcmp(key, "updated_by") == 0)) {
                /* read-only fields a GET returned: a client may PUT back what it read */
            } else if (kind == CONTROL_REQ_PUT &&
                       (strcmp(key, "expires_at") == 0 || strcmp(key, "expires_at_ms") == 0 ||
                        strcmp(key, "revert_to") == 0)) {
                SETF(key);
                if (!json_is_null(v)) {
                    snprintf(err, errlen, "%s is read-only; use \"for\" to make a change expire", key);
                    goto out;
                }
            } else {
                SETF(key);
                snprintf(err, errlen, "unknown field \"%s\"", key);
                goto out;
            }
        }
    }
    if (!have_mode) {
        SETF("mode");
        snprintf(err, errlen, "mode is required (running, paused, rate_limited or draining)");
        goto out;
    }
    if (chg->spec.mode == CONTROL_RATE_LIMITED && !have_rate) {
        SETF(kind == CONTROL_REQ_PUT ? "rate_limit_per_second" : "per_second");
        snprintf(err, errlen, "%s is required for a rate limit", field);
        goto out;
    }
    if (have_rate && chg->spec.mode != CONTROL_RATE_LIMITED) {
        SETF("rate_limit_per_second");
        snprintf(err, errlen, "rate_limit_per_second is only allowed with mode rate_limited");
        goto out;
    }
    if (have_match) {
        if (chg->spec.mode != CONTROL_DRAINING) {
            SETF("drain");
            snprintf(err, errlen, "drain is only allowed with mode draining");
            goto out;
        }
        SETF(kind == CONTROL_REQ_PUT ? "drain" : "match");
        if (control_parse_matchers(match, &chg->spec, err, errlen) != 0)
            goto out;
    }
    SETF(chg->spec.ndrain ? (kind == CONTROL_REQ_PUT ? "drain" : "match") : "mode");
    if (control_spec_validate(&chg->spec, err, errlen) != 0)
        goto out;
    SETF("");
    rc = 0;
out:
    if (rc != 0)
        control_spec_free(&chg->spec);
    json_decref(root);
    return rc;
#undef SETF
}

/* --- transitions ---------------------------------------------------------------------------------- */

int control_state_apply(const control_state_t *cur, const control_change_t *chg, int64_t now_ms, const char *updated_by,
                        control_state_t *next)
{
    assert(control_state_check(cur));
    control_state_init(next);
    if (control_spec_copy(&next->spec, &chg->spec) != 0)
        goto oom;
    next->version = cur->version + 1;
    next->updated_at_ms = now_ms;
    next->updated_by = strdup(updated_by ? updated_by : "");
    next->reason = strdup(chg->reason ? chg->reason : "");
    if (!next->updated_by || !next->reason)
        goto oom;
    if (chg->for_ms > 0) {
        /* The spec being replaced comes back. A change on top of a change that was itself
         * temporary returns to that temporary spec, with no further expiry. */
        if (control_spec_copy(&next->revert, &cur->spec) != 0)
            goto oom;
        next->has_revert = true;
        next->expires_at_ms = now_ms + chg->for_ms;
    }
    assert(control_state_check(next));
    return 0;
oom:
    control_state_free(next);
    return -1;
}

int control_state_revert(const control_state_t *cur, int64_t now_ms, control_state_t *next)
{
    assert(cur->has_revert && control_state_check(cur));
    control_state_init(next);
    if (control_spec_copy(&next->spec, &cur->revert) != 0)
        goto oom;
    next->version = cur->version + 1;
    next->updated_at_ms = now_ms > cur->updated_at_ms ? now_ms : cur->updated_at_ms + 1;
    next->updated_by = strdup("sluice (expiry)");
    char why[128];
    snprintf(why, sizeof(why), "expired: version %llu (%s) ran out", (unsigned long long)cur->version,
             control_mode_name(cur->spec.mode));
    next->reason = strdup(why);
    if (!next->updated_by || !next->reason)
        goto oom;
    assert(control_state_check(next));
    return 0;
oom:
    control_state_free(next);
    return -1;
}

/* --- JSON ------------------------------------------------------------------------------------------ */

void control_format_time(int64_t ms, char *out, size_t cap)
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    char tmp[96]; /* room for any int values, so the format cannot truncate; then cut to cap */
    snprintf(tmp, sizeof(tmp), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
    size_t n = strlen(tmp);
    if (cap) {
        n = n < cap - 1 ? n : cap - 1;
        memcpy(out, tmp, n);
        out[n] = 0;
    }
}

static void control_put_str(buf_t *b, const char *s)
{
    if (s)
        buf_put_json_string(b, s, strlen(s));
    else
        buf_puts(b, "null");
}

/* ,"drain":[{"attribute":..,"regex":..},..] */
static void control_put_drain(buf_t *out, const control_match_t *d, size_t n)
{
    buf_puts(out, ",\"drain\":[");
    for (size_t i = 0; i < n; i++) {
        buf_puts(out, i ? ",{\"attribute\":" : "{\"attribute\":");
        control_put_str(out, d[i].attribute);
        buf_puts(out, ",\"regex\":");
        control_put_str(out, d[i].regex);
        buf_putc(out, '}');
    }
    buf_putc(out, ']');
}

void control_spec_to_json(const control_spec_t *s, buf_t *out)
{
    buf_puts(out, "{\"mode\":");
    control_put_str(out, control_mode_name(s->mode));
    if (s->mode == CONTROL_RATE_LIMITED)
        buf_printf(out, ",\"rate_limit_per_second\":%lld", (long long)s->rate_limit_per_second);
    else
        buf_puts(out, ",\"rate_limit_per_second\":null");
    control_put_drain(out, s->drain, s->ndrain);
    buf_putc(out, '}');
}

void control_state_to_tis_json(const control_state_t *s, buf_t *out)
{
    const control_spec_t *sp = &s->spec;
    buf_printf(out, "{\"pause\":%s,\"lastModified\":%lld,\"controllerType\":\"%s\",",
               sp->mode == CONTROL_PAUSED ? "true" : "false", (long long)s->updated_at_ms, control_spec_tis_type(sp));
    /* the invariant guarantees 0 outside RATE_LIMITED */
    buf_printf(out, "\"payloadParams\":{\"rateLimitPerSecond\":%lld",
               (long long)(sp->mode == CONTROL_RATE_LIMITED ? sp->rate_limit_per_second : 0));
    if (sp->mode == CONTROL_DRAINING && sp->ndrain)
        control_put_drain(out, sp->drain, sp->ndrain);
    buf_puts(out, "}}");
}

void control_state_to_json(const control_state_t *s, const char *job, buf_t *out)
{
    char t[40];
    /* the spec's fields, inline */
    buf_puts(out, "{\"job\":");
    control_put_str(out, job);
    buf_putc(out, ',');
    size_t mark = out->len;
    control_spec_to_json(&s->spec, out);
    /* drop the spec's braces: "{...}" -> "..." */
    memmove(out->data + mark, out->data + mark + 1, out->len - mark - 2);
    out->len -= 2;
    out->data[out->len] = 0;
    buf_printf(out, ",\"version\":%llu", (unsigned long long)s->version);
    if (s->updated_at_ms) {
        control_format_time(s->updated_at_ms, t, sizeof(t));
        buf_printf(out, ",\"updated_at\":\"%s\",\"updated_at_ms\":%lld", t, (long long)s->updated_at_ms);
    } else {
        buf_puts(out, ",\"updated_at\":null,\"updated_at_ms\":0");
    }
    buf_puts(out, ",\"updated_by\":");
    control_put_str(out, s->updated_by ? s->updated_by : "");
    buf_puts(out, ",\"reason\":");
    control_put_str(out, s->reason ? s->reason : "");
    if (s->has_revert) {
        control_format_time(s->expires_at_ms, t, sizeof(t));
        buf_printf(out, ",\"expires_at\":\"%s\",\"expires_at_ms\":%lld,\"revert_to\":", t, (long long)s->expires_at_ms);
        control_spec_to_json(&s->revert, out);
    } else {
        buf_puts(out, ",\"expires_at\":null,\"expires_at_ms\":null,\"revert_to\":null");
    }
    buf_putc(out, '}');
}

static int control_spec_from_obj(json_t *o, control_spec_t *s)
{
    memset(s, 0, sizeof(*s));
    json_t *m = json_object_get(o, "mode");
    if (!json_is_string(m) || control_mode_parse(json_string_value(m), &s->mode) != 0)
        return -1;
    json_t *r = json_object_get(o, "rate_limit_per_second");
    if (json_is_integer(r))
        s->rate_limit_per_second = (int64_t)json_integer_value(r);
    json_t *d = json_object_get(o, "drain");
    size_t n = json_array_size(d);
    if (n) {
        s->drain = calloc(n, sizeof(*s->drain));
        if (!s->drain)
            return -1;
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(d, i);
            const char *a = json_string_value(json_object_get(e, "attribute"));
            const char *x = json_string_value(json_object_get(e, "regex"));
            if (!a || !x)
                return -1;
            s->drain[i].attribute = strdup(a);
            s->drain[i].regex = strdup(x);
            s->ndrain++;
            if (!s->drain[i].attribute || !s->drain[i].regex)
                return -1;
        }
    }
    return control_spec_check(s) ? 0 : -1;
}

int control_state_from_json(const char *json, size_t len, control_state_t *s, char *err, size_t errlen)
{
    control_state_init(s);
    json_error_t je;
    json_t *o = json_loadb(json, len, 0, &je);
    if (!o || !json_is_object(o)) {
        snprintf(err, errlen, "stored state is not a JSON object: %s", o ? "" : je.text);
        json_decref(o);
        return -1;
    }
    int rc = -1;
    if (control_spec_from_obj(o, &s->spec) != 0)
        goto out;
    s->version = (uint64_t)json_integer_value(json_object_get(o, "version"));
    s->updated_at_ms = (int64_t)json_integer_value(json_object_get(o, "updated_at_ms"));
    const char *by = json_string_value(json_object_get(o, "updated_by"));
    const char *why = json_string_value(json_object_get(o, "reason"));
    s->updated_by = strdup(by ? by : "");
    s->reason = strdup(why ? why : "");
    if (!s->updated_by || !s->reason)
        goto out;
    json_t *rv = json_object_get(o, "revert_to");
    if (json_is_object(rv)) {
        if (control_spec_from_obj(rv, &s->revert) != 0)
            goto out;
        s->has_revert = true;
        s->expires_at_ms = (int64_t)json_integer_value(json_object_get(o, "expires_at_ms"));
    }
    rc = control_state_check(s) ? 0 : -1;
out:
    if (rc != 0) {
        snprintf(err, errlen, "stored state is malformed");
        control_state_free(s);
    }
    json_decref(o);
    return rc;
}
