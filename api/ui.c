/*
 * api/ui — the dashboard's static files; see ui.h for the header rules and docs/dashboard.md.
 *
 * The asset table is small (a handful of files) and sorted by nobody: a linear scan with
 * strcmp is cheaper than anything cleverer at this size.
 */
#include "api/ui.h"

#include <string.h>

#include "api/router.h"

const ui_asset_t *ui_asset_find(const char *path)
{
    for (size_t i = 0; i < ui_nassets; i++)
        if (strcmp(ui_assets[i].path, path) == 0)
            return &ui_assets[i];
    return NULL;
}

/* If-None-Match: a list of entity tags or "*"; weak tags compare equal (RFC 9110 §13.1.2). */
static bool ui_etag_matches(const char *inm, const char *etag)
{
    if (!inm)
        return false;
    size_t el = strlen(etag);
    const char *p = inm;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (*p == '*')
            return true;
        if (p[0] == 'W' && p[1] == '/')
            p += 2;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *end = e;
        while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if ((size_t)(end - p) == el && memcmp(p, etag, el) == 0)
            return true;
        p = e;
    }
    return false;
}

static void ui_handler(api_req_t *req, void *ud)
{
    (void)ud;
    api_reply_header(req, "Content-Security-Policy", UI_CSP);
    api_reply_header(req, "X-Content-Type-Options", "nosniff");
    api_reply_header(req, "Referrer-Policy", "no-referrer");
    const ui_asset_t *a = ui_asset_find(req->path);
    if (!a) {
        api_reply_header(req, "Cache-Control", "no-cache");
        api_reply_text(req, 404, "404 page not found\n");
        return;
    }
    api_reply_header(req, "ETag", a->etag);
    api_reply_header(req, "Cache-Control", a->immutable ? "public, max-age=31536000, immutable" : "no-cache");
    if (ui_etag_matches(api_req_header(req, "If-None-Match"), a->etag)) {
        api_reply(req, 304, NULL, NULL, 0);
        return;
    }
    api_reply(req, 200, a->content_type, a->data, a->len);
}

void api_ui_register_routes(api_server_t *srv)
{
    api_route_add(srv, API_GET, "/", "ui", ui_handler, NULL);
    api_route_add(srv, API_GET, "/assets/*", "ui", ui_handler, NULL);
}
