/* mgc_import.c - mgc-import: a Hugging Face model as a checkpoint to start training from.
 *
 *     mgc-import PLAN DIR -o CKPT
 *     mgc-run PLAN --init-from CKPT
 *
 * DIR holds config.json and model.safetensors or its shards (GPT2LMHeadModel, LlamaForCausalLM,
 * MistralForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM or Qwen3MoeForCausalLM, fp32, fp16 or
 * bf16); PLAN is a plan of the same architecture and
 * sizes, in any layout.
 * docs/checkpoints.md, "Importing".  Exit status 0 ok, 1 an error, 2 a usage error. */
#include <stdio.h>
#include <string.h>

#include "export.h"
#include "plan.h"

static void usage(FILE *out) {
    fputs("usage: mgc-import PLAN DIR -o CKPT\n"
          "\n"
          "Writes the Hugging Face model in DIR (config.json and model.safetensors or its shards:\n"
          "GPT-2, LLaMA or Mixtral layout, fp32, fp16 or bf16) as checkpoint CKPT of PLAN's model,\n"
          "to start from\n"
          "with mgc-run PLAN --init-from CKPT (docs/checkpoints.md, \"Importing\").  CKPT must not\n"
          "exist.\n",
          out);
}

int main(int argc, char **argv) {
    const char *plan_path = NULL, *dir = NULL, *ckpt = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "-o")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mgc-import: -o needs a value\n");
                return 2;
            }
            ckpt = argv[++i];
            continue;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "mgc-import: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!plan_path) plan_path = a;
        else if (!dir) dir = a;
        else {
            fprintf(stderr, "mgc-import: one plan and one model directory, not also %s\n", a);
            return 2;
        }
    }
    if (!plan_path || !dir || !ckpt) {
        fprintf(stderr, "mgc-import: give a plan, a model directory and -o CKPT\n");
        usage(stderr);
        return 2;
    }
    char err[4096];
    mgc_plan *plan = NULL;
    if (mgc_plan_read(plan_path, &plan, err, sizeof err) != MGC_PLAN_OK) {
        fprintf(stderr, "mgc-import: %s\n", err);
        return 1;
    }
    int rc = mgc_import(plan, dir, ckpt, err, sizeof err);
    if (rc) fprintf(stderr, "mgc-import: %s\n", err);
    else printf("mgc-import: wrote %s: start from it with mgc-run %s --init-from %s\n", ckpt, plan_path, ckpt);
    mgc_plan_free(plan);
    return rc ? 1 : 0;
}
