/*
 * api/ui — serves the built-in dashboard (web/) from memory: GET / (index.html) and
 * GET /assets/<name>.<hash>.<ext>. The files are embedded at build time by web/embed.cmake into a
 * generated C file (build/gen/web/ui_assets.c) holding the table below; nothing is read from disk
 * at run time. docs/dashboard.md explains the choices.
 *
 * Headers on every answer: the asset's Content-Type, an ETag (a prefix of its SHA-256; a matching
 * If-None-Match gets 304), Cache-Control (assets carry their content hash in their name, so they
 * are "immutable" for a year; index.html is "no-cache" so a new build is picked up at once), and a
 * strict Content-Security-Policy: everything from 'self' only, no inline script or style, no
 * frames, no plugins, no forms.
 */
#ifndef SLUICE_API_UI_H
#define SLUICE_API_UI_H

#include <stdbool.h>
#include <stddef.h>
#include "api/server.h"

typedef struct {
    const char *path; /* URL path: "/" for index.html, "/assets/app.<hash>.js" */
    const char *content_type;
    const char *etag; /* quoted, e.g. "\"3f2a9c1b0d4e\"" */
    bool immutable;   /* the name carries the content hash */
    const unsigned char *data;
    size_t len;
} ui_asset_t;

/* Defined by the generated file. */
extern const ui_asset_t ui_assets[];
extern const size_t ui_nassets;

#define UI_CSP                                                                                                         \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "                    \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* The asset served at `path`, or NULL. */
const ui_asset_t *ui_asset_find(const char *path);
/* Registers GET / and GET /assets/ *. Call before the server starts. */
void api_ui_register_routes(api_server_t *srv);

#endif
