/*
 * fuzz_control_json — internal/control/control.c's JSON readers: control_change_parse for the
 * request bodies of PUT /api/v1/control/jobs/<job> and its pause/resume/rate-limit/drain
 * actions (the first input byte picks the kind), and control_state_from_json, which reads the
 * persisted states back at start-up. Checks: an accepted change validates and applies to a fresh
 * state, giving a state that passes control_state_check and survives a JSON round trip.
 */
#include "internal/control/control.h"
#include "internal/util/buf.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    control_req_kind_t kind = (control_req_kind_t)(data[0] % 5);
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    control_change_t chg;
    char reason[CONTROL_MAX_REASON_LEN + 1], field[128] = "", err[1024] = "";
    if (control_change_parse(kind, body, len, &chg, reason, field, sizeof(field), err, sizeof(err)) == 0) {
        char verr[512];
        FUZZ_CHECK(control_spec_validate(&chg.spec, verr, sizeof(verr)) == 0);
        control_state_t cur, next;
        control_state_init(&cur);
        if (control_state_apply(&cur, &chg, 1700000000000LL, "fuzz", &next) == 0) {
            FUZZ_CHECK(control_state_check(&next));
            buf_t j;
            buf_init(&j);
            control_state_to_json(&next, "job", &j);
            control_state_t back;
            int rc = control_state_from_json(j.data, j.len, &back, err, sizeof(err));
            if (rc != 0)
                fprintf(stderr, "state JSON does not read back: %s\n%.*s\n", err, (int)j.len, j.data);
            FUZZ_CHECK(rc == 0);
            FUZZ_CHECK(back.version == next.version && back.spec.mode == next.spec.mode);
            control_state_free(&back);
            buf_free(&j);
            control_state_free(&next);
        }
        control_state_free(&cur);
        control_spec_free(&chg.spec);
    } else {
        FUZZ_CHECK(err[0] != 0);
    }
    control_state_t st;
    if (control_state_from_json(body, len, &st, err, sizeof(err)) == 0) {
        FUZZ_CHECK(control_state_check(&st));
        control_state_free(&st);
    }
    return 0;
}
