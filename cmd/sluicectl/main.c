/*
 * sluicectl — the operator's command line for sluice's flow control.
 *
 *   sluicectl [--server URL] [--token-file FILE] [--output table|json] COMMAND ...
 *     jobs                                  every job's control state
 *     get JOB                               one job's state
 *     pause JOB [--reason R] [--for 10m]
 *     resume JOB [--reason R]
 *     rate-limit JOB N [--reason R] [--for D]
 *     drain JOB [--match attr=regex]... [--reason R] [--for D]
 *     history JOB [--limit N] [--before V]
 *     watch [JOB]                           follow the change stream (SSE) until interrupted
 *
 * Exit codes: 0 success, 1 the server refused or could not be reached (the message says which),
 * 2 bad usage. Options may come before or after the command. The token file holds one line,
 * `name:token` (the server's format) or just the token.
 */
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd/sluicectl/http.h"
#include "internal/util/buf.h"

typedef struct {
    const char *server;
    const char *token_file;
    const char *output;
    const char *reason;
    const char *for_;
    const char *limit;
    const char *before;
    const char **match;
    int nmatch;
    const char *pos[4]; /* command and its positional arguments */
    int npos;
    char token[4096];
    bool have_token;
    ctl_url_t url;
} cli_t;

static void usage(FILE *f)
{
    fputs("usage: sluicectl [--server URL] [--token-file FILE] [--output table|json] COMMAND ...\n"
          "\n"
          "commands:\n"
          "  jobs                                    list every job's flow-control state\n"
          "  get JOB                                 show one job's state\n"
          "  pause JOB [--reason R] [--for 10m]      stop the job's records until resumed (or for a while)\n"
          "  resume JOB [--reason R]                 back to running\n"
          "  rate-limit JOB N [--reason R] [--for D] at most N records per second\n"
          "  drain JOB [--match attr=regex]...       discard records (all, or those matching)\n"
          "  history JOB [--limit N] [--before V]    the audit log, newest first\n"
          "  watch [JOB]                             follow changes as they happen\n"
          "\n"
          "options:\n"
          "  --server URL       sluice base URL (default http://127.0.0.1:9091)\n"
          "  --token-file FILE  bearer token for changes (name:token or just the token)\n"
          "  --output FORMAT    table (default) or json\n",
          f);
}

static int die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("sluicectl: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

static int cli_parse(cli_t *c, int argc, char **argv)
{
    c->server = "http://127.0.0.1:9091";
    c->output = "table";
    c->match = calloc((size_t)argc, sizeof(*c->match));
    static const char *const with_value[] = {"--server", "--token-file", "--output", "--reason",
                                             "--for",    "--limit",      "--before", "--match"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strncmp(a, "--", 2) != 0 || strcmp(a, "--") == 0) {
            if (c->npos == 4)
                return die(2, "too many arguments (\"%s\")", a);
            c->pos[c->npos++] = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const char *val = NULL;
        int which = -1;
        for (int k = 0; k < (int)(sizeof(with_value) / sizeof(with_value[0])); k++)
            if (strlen(with_value[k]) == nlen && strncmp(a, with_value[k], nlen) == 0)
                which = k;
        if (which < 0)
            return die(2, "unknown option %.*s (see sluicectl --help)", (int)nlen, a);
        if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else
            return die(2, "option %s needs a value", a);
        switch (which) {
        case 0: c->server = val; break;
        case 1: c->token_file = val; break;
        case 2: c->output = val; break;
        case 3: c->reason = val; break;
        case 4: c->for_ = val; break;
        case 5: c->limit = val; break;
        case 6: c->before = val; break;
        case 7: c->match[c->nmatch++] = val; break;
        }
    }
    if (strcmp(c->output, "table") != 0 && strcmp(c->output, "json") != 0)
        return die(2, "--output must be table or json, not \"%s\"", c->output);
    if (c->npos == 0) {
        usage(stderr);
        return 2;
    }
    char err[256];
    if (ctl_url_parse(c->server, &c->url, err, sizeof(err)) != 0)
        return die(2, "--server: %s", err);
    if (c->token_file) {
        FILE *f = fopen(c->token_file, "r");
        if (!f)
            return die(2, "cannot open token file %s: %m", c->token_file);
        char line[4096];
        while (fgets(line, sizeof(line), f)) {
            size_t n = strcspn(line, "\r\n");
            line[n] = 0;
            char *s = line;
            while (*s == ' ' || *s == '\t')
                s++;
            if (!*s || *s == '#')
                continue;
            char *colon = strchr(s, ':');
            snprintf(c->token, sizeof(c->token), "%s", colon ? colon + 1 : s);
            c->have_token = true;
            break;
        }
        fclose(f);
        if (!c->have_token)
            return die(2, "token file %s has no token", c->token_file);
    }
    return 0;
}

/* --- output ------------------------------------------------------------------------------------ */

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void fmt_drain(json_t *state, char *out, size_t cap)
{
    json_t *d = json_object_get(state, "drain");
    size_t n = 0;
    out[0] = 0;
    if (strcmp(jstr(state, "mode"), "draining") != 0)
        return;
    if (json_array_size(d) == 0) {
        snprintf(out, cap, "all records");
        return;
    }
    size_t i;
    json_t *m;
    json_array_foreach(d, i, m)
    {
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s=~%s", i ? "," : "", jstr(m, "attribute"),
                              jstr(m, "regex"));
        if (n >= cap)
            break;
    }
}

static void fmt_param(json_t *s, char *out, size_t cap)
{
    const char *mode = jstr(s, "mode");
    if (strcmp(mode, "rate_limited") == 0)
        snprintf(out, cap, "%lld/s", (long long)json_integer_value(json_object_get(s, "rate_limit_per_second")));
    else
        fmt_drain(s, out, cap);
}

static void print_state_header(void)
{
    printf("%-28s %-13s %-18s %-8s %-24s %-20s %-24s %s\n", "JOB", "MODE", "LIMIT/DRAIN", "VERSION", "UPDATED", "BY",
           "EXPIRES", "REASON");
}

static void print_state_row(json_t *s)
{
    char param[256];
    fmt_param(s, param, sizeof(param));
    const char *upd = jstr(s, "updated_at");
    const char *exp = jstr(s, "expires_at");
    printf("%-28s %-13s %-18s %-8lld %-24s %-20s %-24s %s\n", jstr(s, "job"), jstr(s, "mode"), param[0] ? param : "-",
           (long long)json_integer_value(json_object_get(s, "version")), upd[0] ? upd : "-",
           jstr(s, "updated_by")[0] ? jstr(s, "updated_by") : "-", exp[0] ? exp : "-", jstr(s, "reason"));
}

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s)
        puts(s);
    free(s);
}

/* Reports a non-2xx answer; returns 1. */
static int report_http_error(int status, const buf_t *body)
{
    json_t *j = body->len ? json_loadb(body->data, body->len, 0, NULL) : NULL;
    const char *msg = j ? json_string_value(json_object_get(j, "error")) : NULL;
    const char *field = j ? json_string_value(json_object_get(j, "field")) : NULL;
    if (msg)
        fprintf(stderr, "sluicectl: error: %s%s%s%s (HTTP %d)\n", msg, field ? " [field " : "", field ? field : "",
                field ? "]" : "", status);
    else
        fprintf(stderr, "sluicectl: error: HTTP %d: %.*s\n", status, (int)(body->len > 300 ? 300 : body->len),
                body->data ? body->data : "");
    json_decref(j);
    return 1;
}

/* --- commands ------------------------------------------------------------------------------------ */

static int request(cli_t *c, const char *method, const char *path, const char *body, buf_t *out, bool auth)
{
    char err[512];
    ctl_http_req_t req = {.method = method,
                          .path = path,
                          .token = c->have_token ? c->token : NULL, /* reads need it with --web.control-read-auth */
                          .body = body,
                          .body_len = body ? strlen(body) : 0};
    int status = ctl_http_do(&c->url, &req, out, err, sizeof(err));
    if (status < 0) {
        fprintf(stderr, "sluicectl: error: %s (is sluice running at %s?)\n", err, c->server);
        return -1;
    }
    return status;
}

static void job_path(buf_t *p, const char *job, const char *suffix)
{
    buf_puts(p, "/api/v1/control/jobs/");
    ctl_url_escape(p, job);
    if (suffix)
        buf_puts(p, suffix);
}

static int show_state_reply(cli_t *c, int status, buf_t *body)
{
    if (status < 0)
        return 1;
    if (status < 200 || status > 299)
        return report_http_error(status, body);
    json_t *j = json_loadb(body->data, body->len, 0, NULL);
    if (!j)
        return die(1, "the server's answer is not JSON");
    if (strcmp(c->output, "json") == 0) {
        print_json(j);
    } else {
        print_state_header();
        print_state_row(j);
    }
    json_decref(j);
    return 0;
}

static int cmd_jobs(cli_t *c)
{
    buf_t body = BUF_INIT;
    int st = request(c, "GET", "/api/v1/control/jobs", NULL, &body, false);
    int rc = 1;
    if (st < 0)
        goto out;
    if (st != 200) {
        rc = report_http_error(st, &body);
        goto out;
    }
    json_t *j = json_loadb(body.data, body.len, 0, NULL);
    if (!j) {
        rc = die(1, "the server's answer is not JSON");
        goto out;
    }
    if (strcmp(c->output, "json") == 0) {
        print_json(j);
    } else {
        print_state_header();
        size_t i;
        json_t *s;
        json_array_foreach(json_object_get(j, "jobs"), i, s) print_state_row(s);
    }
    json_decref(j);
    rc = 0;
out:
    buf_free(&body);
    return rc;
}

static int cmd_get(cli_t *c, const char *job)
{
    buf_t path = BUF_INIT, body = BUF_INIT;
    job_path(&path, job, NULL);
    int rc = show_state_reply(c, request(c, "GET", path.data, NULL, &body, false), &body);
    buf_free(&path);
    buf_free(&body);
    return rc;
}

static int cmd_change(cli_t *c, const char *job, const char *action, json_t *payload)
{
    if (c->reason)
        json_object_set_new(payload, "reason", json_string(c->reason));
    if (c->for_)
        json_object_set_new(payload, "for", json_string(c->for_));
    char *js = json_dumps(payload, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(payload);
    buf_t path = BUF_INIT, body = BUF_INIT;
    job_path(&path, job, action);
    int rc = show_state_reply(c, request(c, "POST", path.data, js, &body, true), &body);
    free(js);
    buf_free(&path);
    buf_free(&body);
    return rc;
}

static int cmd_history(cli_t *c, const char *job)
{
    buf_t path = BUF_INIT, body = BUF_INIT;
    job_path(&path, job, "/history");
    char sep = '?';
    if (c->limit) {
        buf_printf(&path, "%climit=", sep);
        ctl_url_escape(&path, c->limit);
        sep = '&';
    }
    if (c->before) {
        buf_printf(&path, "%cbefore=", sep);
        ctl_url_escape(&path, c->before);
    }
    int st = request(c, "GET", path.data, NULL, &body, false);
    int rc = 1;
    if (st < 0)
        goto out;
    if (st != 200) {
        rc = report_http_error(st, &body);
        goto out;
    }
    json_t *j = json_loadb(body.data, body.len, 0, NULL);
    if (!j) {
        rc = die(1, "the server's answer is not JSON");
        goto out;
    }
    if (strcmp(c->output, "json") == 0) {
        print_json(j);
    } else {
        printf("%-8s %-8s %-24s %-13s %-18s %-20s %s\n", "VERSION", "EVENT", "AT", "MODE", "LIMIT/DRAIN", "BY",
               "REASON");
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(j, "entries"), i, e)
        {
            char param[256];
            fmt_param(e, param, sizeof(param));
            printf("%-8lld %-8lld %-24s %-13s %-18s %-20s %s\n",
                   (long long)json_integer_value(json_object_get(e, "version")),
                   (long long)json_integer_value(json_object_get(e, "event_id")), jstr(e, "updated_at"),
                   jstr(e, "mode"), param[0] ? param : "-", jstr(e, "updated_by"), jstr(e, "reason"));
        }
        json_t *nb = json_object_get(j, "next_before");
        if (json_is_integer(nb))
            printf("(more: sluicectl history %s --before %lld)\n", job, (long long)json_integer_value(nb));
    }
    json_decref(j);
    rc = 0;
out:
    buf_free(&path);
    buf_free(&body);
    return rc;
}

/* SSE parsing for watch: lines accumulate until a blank line ends an event. */
typedef struct {
    cli_t *c;
    buf_t line;
    buf_t data;
    char id[32];
    bool header_done;
} watch_t;

static void watch_event(watch_t *w)
{
    if (!w->data.len)
        return;
    json_t *j = json_loadb(w->data.data, w->data.len, 0, NULL);
    if (strcmp(w->c->output, "json") == 0 || !j) {
        printf("%s\n", w->data.data);
    } else {
        if (!w->header_done) {
            printf("%-8s ", "EVENT");
            print_state_header();
            w->header_done = true;
        }
        printf("%-8s ", w->id);
        print_state_row(j);
    }
    fflush(stdout);
    json_decref(j);
    buf_reset(&w->data);
}

static int watch_sink(const char *p, size_t n, void *ud)
{
    watch_t *w = ud;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (p[i] != '\r')
                buf_putc(&w->line, p[i]);
            continue;
        }
        const char *l = w->line.data ? w->line.data : "";
        if (w->line.len == 0) {
            watch_event(w);
        } else if (strncmp(l, "data:", 5) == 0) {
            const char *v = l[5] == ' ' ? l + 6 : l + 5;
            if (w->data.len)
                buf_putc(&w->data, '\n');
            buf_puts(&w->data, v);
        } else if (strncmp(l, "id:", 3) == 0) {
            snprintf(w->id, sizeof(w->id), "%s", l[3] == ' ' ? l + 4 : l + 3);
        }
        buf_reset(&w->line);
    }
    return 0;
}

static int cmd_watch(cli_t *c, const char *job)
{
    buf_t path = BUF_INIT, body = BUF_INIT;
    buf_puts(&path, "/api/v1/control/stream");
    if (job) {
        buf_puts(&path, "?job=");
        ctl_url_escape(&path, job);
    }
    watch_t w = {.c = c};
    char err[512];
    ctl_http_req_t req = {.method = "GET",
                          .path = path.data,
                          .token = c->have_token ? c->token : NULL,
                          .sink = watch_sink,
                          .sink_ud = &w};
    /* An error answer is JSON, not a stream: only stream when the status is 200. The sink sees
     * the body either way; an error body is short and printed below. */
    int st = ctl_http_do(&c->url, &req, &body, err, sizeof(err));
    int rc;
    if (st < 0)
        rc = die(1, "%s (is sluice running at %s?)", err, c->server);
    else if (st != 200)
        rc = report_http_error(st, &w.line);
    else
        rc = die(1, "the server ended the stream");
    buf_free(&w.line);
    buf_free(&w.data);
    buf_free(&path);
    buf_free(&body);
    return rc;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    cli_t c;
    memset(&c, 0, sizeof(c));
    int rc = cli_parse(&c, argc, argv);
    if (rc != 0) {
        free(c.match);
        return rc;
    }
    const char *cmd = c.pos[0];
    const char *job = c.npos > 1 ? c.pos[1] : NULL;
    int want_args = 2;
    if (strcmp(cmd, "jobs") == 0)
        want_args = 1;
    else if (strcmp(cmd, "rate-limit") == 0)
        want_args = 3;
    else if (strcmp(cmd, "watch") == 0)
        want_args = c.npos <= 2 ? c.npos : 2;
    if (c.npos != want_args) {
        rc = die(2, "%s: wrong number of arguments (see sluicectl --help)", cmd);
        goto out;
    }
    if (strcmp(cmd, "jobs") == 0)
        rc = cmd_jobs(&c);
    else if (strcmp(cmd, "get") == 0 || strcmp(cmd, "status") == 0)
        rc = cmd_get(&c, job);
    else if (strcmp(cmd, "pause") == 0)
        rc = cmd_change(&c, job, "/pause", json_object());
    else if (strcmp(cmd, "resume") == 0)
        rc = cmd_change(&c, job, "/resume", json_object());
    else if (strcmp(cmd, "rate-limit") == 0) {
        char *end;
        long long n = strtoll(c.pos[2], &end, 10);
        if (*end || end == c.pos[2]) {
            rc = die(2, "rate-limit: N must be an integer number of records per second, not \"%s\"", c.pos[2]);
            goto out;
        }
        json_t *p = json_object();
        json_object_set_new(p, "per_second", json_integer(n));
        rc = cmd_change(&c, job, "/rate-limit", p);
    } else if (strcmp(cmd, "drain") == 0) {
        json_t *p = json_object();
        if (c.nmatch) {
            json_t *arr = json_array();
            for (int i = 0; i < c.nmatch; i++) {
                const char *eq = strchr(c.match[i], '=');
                if (!eq || eq == c.match[i]) {
                    json_decref(arr);
                    json_decref(p);
                    rc = die(2, "--match must be attribute=regex, not \"%s\"", c.match[i]);
                    goto out;
                }
                json_t *m = json_object();
                json_object_set_new(m, "attribute", json_stringn(c.match[i], (size_t)(eq - c.match[i])));
                json_object_set_new(m, "regex", json_string(eq + 1));
                json_array_append_new(arr, m);
            }
            json_object_set_new(p, "match", arr);
        }
        rc = cmd_change(&c, job, "/drain", p);
    } else if (strcmp(cmd, "history") == 0)
        rc = cmd_history(&c, job);
    else if (strcmp(cmd, "watch") == 0)
        rc = cmd_watch(&c, job);
    else
        rc = die(2, "unknown command \"%s\" (see sluicectl --help)", cmd);
out:
    free(c.match);
    return rc;
}
