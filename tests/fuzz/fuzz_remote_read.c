/*
 * fuzz_remote_read — POST /api/v1/read request decoding: snappy as fuzz_remote_write, then
 * protobuf-c's ReadRequest unpack into an arena (as api/remote.c does), response type
 * negotiation, and every query's matchers built with matcher_new (RE2 for =~ and !~), the part
 * of api/remote.c's rqueries_build that can fail on client input. A built matcher is also run
 * against its own value and the empty string. Raw input is unpacked as well.
 */
#include <snappy-c.h>

#include "internal/proto/remote.pb-c.h"
#include "internal/labels/matcher.h"
#include "internal/util/arena.h"
#include "tests/fuzz/fuzz.h"

#define MAX_DECODED (4u << 20)

static void *al_alloc(void *ud, size_t n)
{
    return arena_try_alloc(ud, n ? n : 1);
}

static void al_free(void *ud, void *p)
{
    (void)ud;
    (void)p;
}

static void decode(const uint8_t *buf, size_t len)
{
    arena_t *a = arena_create(64u << 20);
    ProtobufCAllocator al = {al_alloc, al_free, a};
    Prometheus__ReadRequest *rr = prometheus__read_request__unpack(&al, len, buf);
    if (rr) {
        for (size_t i = 0; i < rr->n_accepted_response_types; i++)
            (void)rr->accepted_response_types[i];
        for (size_t i = 0; i < rr->n_queries && i < 64; i++) {
            const Prometheus__Query *q = rr->queries[i];
            FUZZ_CHECK(q != NULL);
            for (size_t j = 0; j < q->n_matchers && j < 64; j++) {
                const Prometheus__LabelMatcher *m = q->matchers[j];
                if ((unsigned)m->type > MATCHER_NRE)
                    continue; /* answered 400 "unknown matcher type" */
                char merr[512];
                const char *name = m->name ? m->name : "", *value = m->value ? m->value : "";
                matcher_t *mt = matcher_new((matcher_type_t)m->type, name, value, merr, sizeof(merr));
                if (!mt) {
                    FUZZ_CHECK(merr[0] != 0);
                    continue;
                }
                FUZZ_CHECK(strcmp(matcher_name(mt), name) == 0);
                (void)matcher_matches(mt, value, strlen(value));
                FUZZ_CHECK(matcher_matches(mt, "", 0) == matcher_matches_empty(mt));
                matcher_free(mt);
            }
            if (q->hints)
                (void)q->hints->step_ms;
        }
    }
    arena_destroy(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t dlen;
    if (snappy_uncompressed_length((const char *)data, size, &dlen) == SNAPPY_OK && dlen <= MAX_DECODED) {
        char *d = malloc(dlen ? dlen : 1);
        size_t got = dlen;
        if (snappy_uncompress((const char *)data, size, d, &got) == SNAPPY_OK && got == dlen)
            decode((const uint8_t *)d, dlen);
        free(d);
    }
    decode(data, size);
    return 0;
}
