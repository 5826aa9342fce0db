/* fuzz_frontend.c - libFuzzer harness over the whole front end.
 *
 * Input: YAML text, optionally followed by a NUL byte and `--set`
 * assignments separated by NUL bytes.  Runs load -> overrides -> finalize ->
 * IR -> facts and frees everything; any crash, hang, leak or sanitizer report
 * is a bug.  Built with clang (-fsanitize=fuzzer) when MGC_FUZZ=ON; without
 * it, fuzz_replay.c drives the same function over the corpus files. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "facts.h"
#include "ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    size_t yaml_len = size;
    const void *nul = memchr(data, 0, size);
    if (nul) yaml_len = (size_t)((const uint8_t *)nul - data);

    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = mgc_config_new();
    if (!c) return 0;
    mgc_config_load_text(c, "fuzz.yaml", text, yaml_len, &d);
    /* the rest: NUL-separated --set assignments (at most 8) */
    size_t pos = yaml_len + 1;
    for (int i = 0; i < 8 && pos < size; i++) {
        const void *end = memchr(data + pos, 0, size - pos);
        size_t n = end ? (size_t)((const uint8_t *)end - (data + pos)) : size - pos;
        char *assign = malloc(n + 1);
        if (!assign) break;
        memcpy(assign, data + pos, n);
        assign[n] = 0;
        mgc_config_set(c, assign, "--set", &d);
        free(assign);
        pos += n + 1;
    }
    if (d.errors == 0) mgc_config_finalize(c, &d);
    if (d.errors == 0) {
        mgc_graph *g = mgc_ir_build(c, &d);
        if (g && d.errors == 0) {
            mgc_facts f;
            mgc_facts_compute(c, g, &f, &d);
        }
        mgc_ir_free(g);
    }
    mgc_diags_sort(&d);
    /* printing exercises the formatting paths; send it nowhere */
    FILE *sink = fopen("/dev/null", "w");
    if (sink) {
        mgc_diags_print(&d, sink);
        fclose(sink);
    }
    mgc_config_free(c);
    mgc_diags_free(&d);
    return 0;
}
