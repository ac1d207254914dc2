/*
 * rules/rulefile — loading and checking Prometheus rule files; see rulefile.h.
 *
 * Two phases, as in Prometheus (rulefmt.Parse): decoding the YAML tree into groups and rules
 * (structure errors are gathered into one "yaml: unmarshal errors:" message; a bad duration stops
 * decoding at once, as the Go decoder's UnmarshalYAML does), then validation (names, duplicate
 * groups, record/alert exclusivity, label names, PromQL, templates), which reports every problem.
 * Positions are those of the YAML node (1-based line:column), "0:0" for a missing node, exactly
 * as promtool prints them.
 */
#include "internal/rules/rulefile.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "internal/rules/template.h"
#include "internal/util/parse.h"

typedef struct {
    yaml_node_t *node; /* NULL when absent */
} rf_field_t;

typedef struct {
    rf_field_t record, alert, expr, forf, keep, labels, annotations;
    yaml_node_t *self;
} rf_rule_nodes_t;

typedef struct {
    const char *path;
    yaml_document_t *doc;
    buf_t *errs;
    buf_t unmarshal; /* "  line N: ..." lines */
    int nunmarshal;
    char *fatal; /* a duration error: decoding stops */
} rf_ctx_t;

void rules_labels_free(labels_t *ls)
{
    for (size_t i = 0; i < ls->n; i++) {
        free((char *)ls->v[i].name);
        free((char *)ls->v[i].value);
    }
    free(ls->v);
    ls->v = NULL;
    ls->n = 0;
}

int rules_labels_dup(labels_t *dst, const labels_t *src)
{
    dst->v = NULL;
    dst->n = 0;
    if (!src || src->n == 0)
        return 0;
    dst->v = calloc(src->n, sizeof(*dst->v));
    if (!dst->v)
        return -1;
    for (size_t i = 0; i < src->n; i++) {
        dst->v[i].name = strdup(src->v[i].name);
        dst->v[i].value = strdup(src->v[i].value);
        dst->n++;
        if (!dst->v[i].name || !dst->v[i].value) {
            rules_labels_free(dst);
            return -1;
        }
    }
    return 0;
}

static const char *rf_tag_name(yaml_node_t *n)
{
    switch (n->type) {
    case YAML_MAPPING_NODE: return "!!map";
    case YAML_SEQUENCE_NODE: return "!!seq";
    default: return "!!str";
    }
}

static void rf_type_error(rf_ctx_t *x, yaml_node_t *n, const char *into)
{
    if (n->type == YAML_SCALAR_NODE)
        buf_printf(&x->unmarshal, "\n  line %zu: cannot unmarshal %s `%.*s` into %s", n->start_mark.line + 1,
                   rf_tag_name(n), (int)(n->data.scalar.length > 40 ? 40 : n->data.scalar.length),
                   (const char *)n->data.scalar.value, into);
    else
        buf_printf(&x->unmarshal, "\n  line %zu: cannot unmarshal %s into %s", n->start_mark.line + 1, rf_tag_name(n),
                   into);
    x->nunmarshal++;
}

static bool rf_is_null(yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE)
        return false;
    const char *t = (const char *)n->tag;
    if (t && strcmp(t, YAML_NULL_TAG) == 0)
        return true;
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return strcmp(v, "") == 0 || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 || strcmp(v, "Null") == 0 ||
           strcmp(v, "NULL") == 0;
}

static const char *rf_scalar(yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* A duration field; sets x->fatal on a bad value. */
static int64_t rf_duration(rf_ctx_t *x, yaml_node_t *n)
{
    if (!n || rf_is_null(n))
        return 0;
    if (n->type != YAML_SCALAR_NODE) {
        rf_type_error(x, n, "model.Duration");
        return 0;
    }
    int64_t ms;
    if (parse_duration_ms(rf_scalar(n), &ms) != 0) {
        if (!x->fatal) {
            buf_t b = BUF_INIT;
            buf_printf(&b, "not a valid duration string: \"%s\"", rf_scalar(n));
            x->fatal = buf_steal(&b, NULL);
        }
        return 0;
    }
    return ms;
}

/* Decodes a map[string]string into a sorted, owned label set. */
static void rf_map(rf_ctx_t *x, yaml_node_t *n, labels_t *out)
{
    out->v = NULL;
    out->n = 0;
    if (!n || rf_is_null(n))
        return;
    if (n->type != YAML_MAPPING_NODE) {
        rf_type_error(x, n, "map[string]string");
        return;
    }
    size_t cnt = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    out->v = calloc(cnt ? cnt : 1, sizeof(*out->v));
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(x->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(x->doc, p->value);
        if (k->type != YAML_SCALAR_NODE) {
            rf_type_error(x, k, "string");
            continue;
        }
        if (v->type != YAML_SCALAR_NODE) {
            rf_type_error(x, v, "string");
            continue;
        }
        const char *key = rf_scalar(k);
        size_t j;
        for (j = 0; j < out->n; j++)
            if (strcmp(out->v[j].name, key) == 0)
                break;
        const char *val = rf_is_null(v) ? "" : rf_scalar(v);
        if (j < out->n) { /* a repeated key: Go's map keeps the last */
            free((char *)out->v[j].value);
            out->v[j].value = strdup(val);
            continue;
        }
        out->v[out->n].name = strdup(key);
        out->v[out->n].value = strdup(val);
        out->n++;
    }
    labels_sort(out);
}

static void rf_rule_free(rules_rule_def_t *r)
{
    free(r->name);
    free(r->expr);
    if (r->ast)
        promql_ast_free(r->ast);
    rules_labels_free(&r->labels);
    rules_labels_free(&r->annotations);
}

static void rf_group_free(rules_group_def_t *g)
{
    for (size_t i = 0; i < g->nrules; i++)
        rf_rule_free(&g->rules[i]);
    free(g->rules);
    free(g->name);
    free(g->file);
}

void rules_file_free(rules_file_t *f)
{
    for (size_t i = 0; i < f->ngroups; i++)
        rf_group_free(&f->groups[i]);
    free(f->groups);
    memset(f, 0, sizeof(*f));
}

/* --- validation ----------------------------------------------------------------------------------- */

static void rf_pos(buf_t *b, yaml_node_t *n)
{
    if (n)
        buf_printf(b, "%zu:%zu: ", n->start_mark.line + 1, n->start_mark.column + 1);
    else
        buf_puts(b, "0:0: ");
}

static int rf_rule_error(rf_ctx_t *x, yaml_node_t *n1, yaml_node_t *n2, bool with_pos, const char *group, size_t idx,
                         const char *rname, const char *fmt, const char *a1)
{
    buf_printf(x->errs, "%s: ", x->path);
    if (with_pos) {
        rf_pos(x->errs, n1);
        if (n2)
            rf_pos(x->errs, n2);
    }
    buf_printf(x->errs, "group \"%s\", rule %zu, \"%s\": ", group, idx, rname);
    buf_printf(x->errs, fmt, a1);
    buf_putc(x->errs, '\n');
    return 1;
}

static int rf_check_templates(rf_ctx_t *x, const char *group, size_t idx, rules_rule_def_t *r)
{
    int nerr = 0;
    char tname[512], err[512];
    snprintf(tname, sizeof(tname), "__alert_%s", r->name);
    for (int pass = 0; pass < 2; pass++) {
        labels_t *ls = pass == 0 ? &r->labels : &r->annotations;
        for (size_t i = 0; i < ls->n; i++) {
            if (rules_tmpl_is_plain(ls->v[i].value))
                continue;
            rules_tmpl_t *t = rules_tmpl_parse(tname, ls->v[i].value, err, sizeof(err));
            if (t) {
                rules_tmpl_free(t);
                continue;
            }
            buf_printf(x->errs, "%s: group \"%s\", rule %zu, \"%s\": %s \"%s\": %s\n", x->path, group, idx, r->name,
                       pass == 0 ? "label" : "annotation", ls->v[i].name, err);
            nerr++;
        }
    }
    return nerr;
}

/* Decodes and checks one rule; returns the number of errors. */
static int rf_rule(rf_ctx_t *x, yaml_node_t *n, const char *group, size_t idx, rules_rule_def_t *r)
{
    rf_rule_nodes_t rn = {.self = n};
    if (n->type != YAML_MAPPING_NODE) {
        rf_type_error(x, n, "rulefmt.RuleNode");
        return 0;
    }
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(x->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(x->doc, p->value);
        const char *key = k->type == YAML_SCALAR_NODE ? rf_scalar(k) : "";
        rf_field_t *f = NULL;
        if (strcmp(key, "record") == 0)
            f = &rn.record;
        else if (strcmp(key, "alert") == 0)
            f = &rn.alert;
        else if (strcmp(key, "expr") == 0)
            f = &rn.expr;
        else if (strcmp(key, "for") == 0)
            f = &rn.forf;
        else if (strcmp(key, "keep_firing_for") == 0)
            f = &rn.keep;
        else if (strcmp(key, "labels") == 0)
            f = &rn.labels;
        else if (strcmp(key, "annotations") == 0)
            f = &rn.annotations;
        if (!f) {
            buf_printf(&x->unmarshal, "\n  line %zu: field %s not found in type rulefmt.RuleNode",
                       k->start_mark.line + 1, key);
            x->nunmarshal++;
            continue;
        }
        f->node = v;
        if ((f == &rn.record || f == &rn.alert || f == &rn.expr) && v->type != YAML_SCALAR_NODE) {
            rf_type_error(x, v, "string");
            f->node = NULL;
        }
    }
    /* yaml.Node fields: a null scalar is a present node with an empty value */
    const char *record = rn.record.node ? (rf_is_null(rn.record.node) ? "" : rf_scalar(rn.record.node)) : "";
    const char *alert = rn.alert.node ? (rf_is_null(rn.alert.node) ? "" : rf_scalar(rn.alert.node)) : "";
    const char *expr = rn.expr.node ? (rf_is_null(rn.expr.node) ? "" : rf_scalar(rn.expr.node)) : "";
    r->for_ms = rf_duration(x, rn.forf.node);
    r->keep_firing_for_ms = rf_duration(x, rn.keep.node);
    rf_map(x, rn.labels.node, &r->labels);
    rf_map(x, rn.annotations.node, &r->annotations);
    r->kind = alert[0] ? RULES_ALERT : RULES_RECORD;
    r->name = strdup(alert[0] ? alert : record);
    r->expr = strdup(expr);
    if (x->fatal || x->nunmarshal)
        return 0;

    /* rulefmt.RuleNode.Validate, in its order */
    int nerr = 0;
    const char *rname = r->name;
    yaml_node_t *rec_node = rn.record.node, *alert_node = rn.alert.node;
    if (record[0] && alert[0])
        nerr += rf_rule_error(x, rec_node, alert_node, true, group, idx, rname,
                              "only one of 'record' and 'alert' must be set%s", "");
    if (!record[0] && !alert[0])
        nerr +=
            rf_rule_error(x, rec_node, NULL, true, group, idx, rname, "one of 'record' or 'alert' must be set%s", "");
    if (!expr[0]) {
        nerr += rf_rule_error(x, rn.expr.node, NULL, true, group, idx, rname, "field 'expr' must be set in rule%s", "");
    } else {
        char perr[512];
        r->ast = promql_parse(expr, perr, sizeof(perr));
        if (!r->ast)
            nerr +=
                rf_rule_error(x, rn.expr.node, NULL, true, group, idx, rname, "could not parse expression: %s", perr);
    }
    if (record[0]) {
        if (rn.annotations.node && r->annotations.n > 0)
            nerr += rf_rule_error(x, rec_node, NULL, true, group, idx, rname,
                                  "invalid field 'annotations' in recording rule%s", "");
        if (rn.forf.node && r->for_ms != 0)
            nerr += rf_rule_error(x, rec_node, NULL, true, group, idx, rname, "invalid field 'for' in recording rule%s",
                                  "");
        if (rn.keep.node && r->keep_firing_for_ms != 0)
            nerr += rf_rule_error(x, rec_node, NULL, true, group, idx, rname,
                                  "invalid field 'keep_firing_for' in recording rule%s", "");
        if (!labels_valid_metric_name(record, strlen(record)))
            nerr +=
                rf_rule_error(x, rec_node, NULL, true, group, idx, rname, "invalid recording rule name: %s", record);
    }
    for (size_t i = 0; i < r->labels.n; i++) {
        const char *k = r->labels.v[i].name;
        if (!labels_valid_name(k, strlen(k)) || strcmp(k, LABEL_METRIC_NAME) == 0)
            nerr += rf_rule_error(x, NULL, NULL, false, group, idx, rname, "invalid label name: %s", k);
    }
    for (size_t i = 0; i < r->annotations.n; i++) {
        const char *k = r->annotations.v[i].name;
        if (!labels_valid_name(k, strlen(k)))
            nerr += rf_rule_error(x, NULL, NULL, false, group, idx, rname, "invalid annotation name: %s", k);
    }
    if (alert[0])
        nerr += rf_check_templates(x, group, idx, r);
    return nerr;
}

int rules_file_load(rules_file_t *f, const char *path, buf_t *errs)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        buf_printf(errs, "%s: open %s: %s\n", path, path, strerror(errno));
        return 1;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        fclose(fp);
        buf_printf(errs, "%s: out of memory\n", path);
        return 1;
    }
    yaml_parser_set_input_file(&parser, fp);
    if (!yaml_parser_load(&parser, &doc)) {
        buf_printf(errs, "%s: yaml: line %zu: %s\n", path, parser.problem_mark.line + 1,
                   parser.problem ? parser.problem : "invalid YAML");
        yaml_parser_delete(&parser);
        fclose(fp);
        return 1;
    }
    rf_ctx_t x = {.path = path, .doc = &doc, .errs = errs};
    rules_group_def_t *groups = NULL;
    size_t ngroups = 0;
    int nerr = 0;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_node_t *gseq = NULL;
    if (root && !rf_is_null(root)) {
        if (root->type != YAML_MAPPING_NODE) {
            rf_type_error(&x, root, "rulefmt.RuleGroups");
        } else {
            for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
                yaml_node_t *k = yaml_document_get_node(&doc, p->key);
                const char *key = k->type == YAML_SCALAR_NODE ? rf_scalar(k) : "";
                if (strcmp(key, "groups") == 0) {
                    gseq = yaml_document_get_node(&doc, p->value);
                } else {
                    buf_printf(&x.unmarshal, "\n  line %zu: field %s not found in type rulefmt.RuleGroups",
                               k->start_mark.line + 1, key);
                    x.nunmarshal++;
                }
            }
        }
    }
    if (gseq && !rf_is_null(gseq) && gseq->type != YAML_SEQUENCE_NODE) {
        rf_type_error(&x, gseq, "[]rulefmt.RuleGroup");
        gseq = NULL;
    }
    if (gseq && gseq->type == YAML_SEQUENCE_NODE) {
        size_t cnt = (size_t)(gseq->data.sequence.items.top - gseq->data.sequence.items.start);
        groups = calloc(cnt ? cnt : 1, sizeof(*groups));
        for (yaml_node_item_t *it = gseq->data.sequence.items.start; it < gseq->data.sequence.items.top; it++) {
            yaml_node_t *gn = yaml_document_get_node(&doc, *it);
            if (gn->type != YAML_MAPPING_NODE) {
                rf_type_error(&x, gn, "rulefmt.RuleGroup");
                continue;
            }
            rules_group_def_t *g = &groups[ngroups++];
            g->file = strdup(path);
            yaml_node_t *name = NULL, *rules = NULL;
            for (yaml_node_pair_t *p = gn->data.mapping.pairs.start; p < gn->data.mapping.pairs.top; p++) {
                yaml_node_t *k = yaml_document_get_node(&doc, p->key);
                yaml_node_t *v = yaml_document_get_node(&doc, p->value);
                const char *key = k->type == YAML_SCALAR_NODE ? rf_scalar(k) : "";
                if (strcmp(key, "name") == 0) {
                    if (v->type != YAML_SCALAR_NODE)
                        rf_type_error(&x, v, "string");
                    else
                        name = v;
                } else if (strcmp(key, "interval") == 0) {
                    g->interval_ms = rf_duration(&x, v);
                } else if (strcmp(key, "limit") == 0) {
                    int64_t lim = 0;
                    if (!rf_is_null(v) && (v->type != YAML_SCALAR_NODE || parse_int64(rf_scalar(v), &lim) != 0)) {
                        /* parse_int64 takes no sign; Go's int does */
                        if (v->type == YAML_SCALAR_NODE && rf_scalar(v)[0] == '-' &&
                            parse_int64(rf_scalar(v) + 1, &lim) == 0)
                            lim = -lim;
                        else
                            rf_type_error(&x, v, "int");
                    }
                    g->limit = lim;
                } else if (strcmp(key, "rules") == 0) {
                    if (!rf_is_null(v) && v->type != YAML_SEQUENCE_NODE)
                        rf_type_error(&x, v, "[]rulefmt.RuleNode");
                    else
                        rules = v;
                } else {
                    buf_printf(&x.unmarshal, "\n  line %zu: field %s not found in type rulefmt.RuleGroup",
                               k->start_mark.line + 1, key);
                    x.nunmarshal++;
                }
            }
            g->name = strdup(name && !rf_is_null(name) ? rf_scalar(name) : "");
            /* rulefmt.RuleGroups.Validate: group checks come before the group's rules */
            if (!x.fatal && !x.nunmarshal) {
                if (!g->name[0]) {
                    buf_printf(errs, "%s: ", path);
                    rf_pos(errs, gn);
                    buf_puts(errs, "Groupname must not be empty\n");
                    nerr++;
                }
                for (size_t j = 0; j + 1 < ngroups; j++)
                    if (strcmp(groups[j].name, g->name) == 0) {
                        buf_printf(errs, "%s: ", path);
                        rf_pos(errs, gn);
                        buf_printf(errs, "groupname: \"%s\" is repeated in the same file\n", g->name);
                        nerr++;
                        break;
                    }
            }
            if (rules && rules->type == YAML_SEQUENCE_NODE) {
                size_t rc = (size_t)(rules->data.sequence.items.top - rules->data.sequence.items.start);
                g->rules = calloc(rc ? rc : 1, sizeof(*g->rules));
                for (yaml_node_item_t *ri = rules->data.sequence.items.start; ri < rules->data.sequence.items.top;
                     ri++) {
                    rules_rule_def_t *r = &g->rules[g->nrules++];
                    nerr += rf_rule(&x, yaml_document_get_node(&doc, *ri), g->name, g->nrules, r);
                }
            }
        }
    }
    if (x.fatal) {
        /* a decoding error replaces the validation errors gathered so far, as in Go */
        buf_printf(errs, "%s: %s\n", path, x.fatal);
        nerr = 1;
    } else if (x.nunmarshal) {
        buf_printf(errs, "%s: yaml: unmarshal errors:%s\n", path, x.unmarshal.data);
        nerr = 1;
    }
    free(x.fatal);
    buf_free(&x.unmarshal);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(fp);
    if (nerr) {
        for (size_t i = 0; i < ngroups; i++)
            rf_group_free(&groups[i]);
        free(groups);
        return nerr;
    }
    if (ngroups) {
        rules_group_def_t *ng = realloc(f->groups, (f->ngroups + ngroups) * sizeof(*ng));
        if (!ng) {
            for (size_t i = 0; i < ngroups; i++)
                rf_group_free(&groups[i]);
            free(groups);
            buf_printf(errs, "%s: out of memory\n", path);
            return 1;
        }
        memcpy(ng + f->ngroups, groups, ngroups * sizeof(*ng));
        f->groups = ng;
        f->ngroups += ngroups;
    }
    free(groups);
    f->nfiles++;
    return 0;
}

int rules_files_load(rules_file_t *f, const char *const *patterns, size_t npatterns, buf_t *errs)
{
    int nerr = 0;
    for (size_t i = 0; i < npatterns; i++) {
        if (!patterns[i] || !patterns[i][0])
            continue;
        glob_t g;
        int rc = glob(patterns[i], 0, NULL, &g);
        if (rc == GLOB_NOMATCH) {
            /* Prometheus ignores a glob that matches nothing; a plain path must exist */
            if (!strpbrk(patterns[i], "*?[")) {
                buf_printf(errs, "%s: open %s: no such file or directory\n", patterns[i], patterns[i]);
                nerr++;
            }
            continue;
        }
        if (rc != 0) {
            buf_printf(errs, "%s: invalid rule file pattern\n", patterns[i]);
            nerr++;
            continue;
        }
        for (size_t j = 0; j < g.gl_pathc; j++)
            nerr += rules_file_load(f, g.gl_pathv[j], errs);
        globfree(&g);
    }
    return nerr;
}
