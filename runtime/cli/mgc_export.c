/* mgc_export.c - mgc-export: a checkpoint's model as a safetensors file.
 *
 *     mgc-export PLAN CKPT -o DIR [--format hf|mgc] [--dtype fp32|bf16|fp16]
 *
 * PLAN is any plan of the model (its layout does not matter: checkpoints hold the model
 * whole); CKPT a checkpoint mgc-run wrote for it.  docs/checkpoints.md, "Exporting".  Exit
 * status 0 ok, 1 an error, 2 a usage error. */
#include <stdio.h>
#include <string.h>

#include "export.h"
#include "plan.h"

static void usage(FILE *out) {
    fputs("usage: mgc-export PLAN CKPT -o DIR [--format hf|mgc] [--dtype fp32|bf16|fp16]\n"
          "\n"
          "Writes the model of checkpoint CKPT (saved by mgc-run for PLAN's model, in any layout)\n"
          "to DIR/model.safetensors (docs/checkpoints.md, \"Exporting\").\n"
          "\n"
          "options:\n"
          "  -o DIR           the directory (created when missing; existing files are never\n"
          "                   replaced)\n"
          "  --format hf      Hugging Face transformers' layout and DIR/config.json:\n"
          "                   GPT2LMHeadModel for GPT-2-style models, LlamaForCausalLM for\n"
          "                   LLaMA-style ones (MistralForCausalLM with model.window_size,\n"
          "                   Qwen3ForCausalLM with model.qk_layernorm),\n"
          "                   MixtralForCausalLM for their mixtures of experts\n"
          "                   (Qwen3MoeForCausalLM with the norms) (default)\n"
          "  --format mgc     every parameter whole under mgc's own names (any model, MoE too)\n"
          "  --dtype T        fp32 (default), bf16 or fp16: the fp32 master weights rounded to\n"
          "                   nearest even\n"
          "  -h, --help       this text\n",
          out);
}

int main(int argc, char **argv) {
    const char *plan_path = NULL, *ckpt = NULL, *dir = NULL;
    mgc_export_format fmt = MGC_EXPORT_HF;
    int dtype = MGC_DT_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "-o") || !strcmp(a, "--format") || !strcmp(a, "--dtype")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mgc-export: %s needs a value\n", a);
                usage(stderr);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "-o")) {
                dir = v;
            } else if (!strcmp(a, "--format")) {
                if (!strcmp(v, "hf")) fmt = MGC_EXPORT_HF;
                else if (!strcmp(v, "mgc")) fmt = MGC_EXPORT_MGC;
                else {
                    fprintf(stderr, "mgc-export: --format %s: use hf or mgc\n", v);
                    return 2;
                }
            } else {
                if (!strcmp(v, "fp32")) dtype = MGC_DT_F32;
                else if (!strcmp(v, "bf16")) dtype = MGC_DT_BF16;
                else if (!strcmp(v, "fp16")) dtype = MGC_DT_F16;
                else {
                    fprintf(stderr, "mgc-export: --dtype %s: use fp32, bf16 or fp16\n", v);
                    return 2;
                }
            }
            continue;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "mgc-export: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!plan_path) plan_path = a;
        else if (!ckpt) ckpt = a;
        else {
            fprintf(stderr, "mgc-export: one plan and one checkpoint, not also %s\n", a);
            return 2;
        }
    }
    if (!plan_path || !ckpt || !dir) {
        fprintf(stderr, "mgc-export: give a plan, a checkpoint and -o DIR\n");
        usage(stderr);
        return 2;
    }
    char err[4096];
    mgc_plan *plan = NULL;
    if (mgc_plan_read(plan_path, &plan, err, sizeof err) != MGC_PLAN_OK) {
        fprintf(stderr, "mgc-export: %s\n", err);
        return 1;
    }
    int rc = mgc_export(plan, ckpt, dir, fmt, dtype, err, sizeof err);
    if (rc) fprintf(stderr, "mgc-export: %s\n", err);
    else printf("mgc-export: wrote %s/model.safetensors%s\n", dir, fmt == MGC_EXPORT_HF ? " and config.json" : "");
    mgc_plan_free(plan);
    return rc ? 1 : 0;
}
