/* fuzz_plan.c - libFuzzer harness over the plan reader: any byte string is
 * either rejected with a message or decodes to a plan that validates and
 * re-encodes.  This is the runtime's first contact with a file from disk. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mgc_plan *p = NULL;
    char err[512];
    if (mgc_plan_decode(data, size, "fuzz.plan", &p, err, sizeof err) == MGC_PLAN_OK) {
        if (mgc_plan_validate(p, err, sizeof err) != MGC_PLAN_OK) abort(); /* decode must validate */
        uint8_t *buf = NULL;
        size_t len = 0;
        if (mgc_plan_encode(p, &buf, &len, err, sizeof err) != MGC_PLAN_OK) abort();
        free(buf);
    }
    mgc_plan_free(p);
    return 0;
}
