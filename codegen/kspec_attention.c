/* kspec_attention.c - kernel specs of the attention family (kernels/attention.cuh).
 *
 *   ATTENTION      -> attention_fwd (D, CAUSAL, DROP, ROWPOS [, DOCS] [, WIN])
 *   ATTENTION_BWD  -> attention_bwd_dq (D, CAUSAL, DROP, ROWPOS [, DOCS] [, WIN]; it also
 *                     writes each row's rowsum(dO o O)), attention_bwd_dkv (the same constants)
 *                     (launch order)
 *
 * D is the head dim (q's last dim: a multiple of 8 from 8 to 256), CAUSAL the op's
 * iattr[0], DROP whether it has dropout (fattr[1] > 0: a kernel without it has no Philox code
 * in its inner loop), ROWPOS whether rows are positions (no context parallelism, iattr[3] <= 1,
 * and no MGC_ATT_POSITIONS=1: the masks need no position arithmetic), DOCS = 1 (only when set: other plans keep their kernels' names) whether
 * queries see only their own document (MGC_POF_DOCS, data.reset_attention_mask), WIN the
 * sliding window in keys (fattr[2], model.window_size; only when set, causal only: a number the
 * plan validator bounds), FBK (only under MGC_ATT_FWD_KEYS, 16-bit, D to 128) the forward's keys a
 * step, KVR (only under MGC_ATT_DKV_ROWS, 16-bit, D to 64) the dK/dV kernel's query rows a
 * step, KVB (under MGC_ATT_DKV_BUFS, or 1 in its twin) and FKVB (under MGC_ATT_FWD_BUFS, or 1
 * in its twin) the dK/dV kernel's and the forward's buffers past D 64 to 128, CS = 1 (only
 * when set) on both backward kernels of a 16-bit
 * attention_bwd that sums the QKV projection's bias gradient (MGC_POF_COLSUM: each block writes
 * the column sums of the dqkv rows it stores, a row of partials a 64-row tile).  The storage
 * dtype is q's (fp32, bf16 or fp16); the sequence lengths, heads, scale, the dropout rate and
 * the context-parallel layout are kernel arguments (runtime/cuda_ops_attention.c). */
#include "kspec.h"

#include <stdlib.h>
#include <string.h>

static int attn_dims(const mgc_plan_chunk *ch, const mgc_plan_op *op, int *dtype, int64_t *d) {
    mgc_attn_geom g; /* q's own tensor, or the fused projection (MGC_POF_QKV): a kernel argument */
    if (mgc_plan_attn_geom(ch, op, &g)) return -1;
    if ((*dtype = mgc_kspec_storage(ch->tensors[op->in[0]].dtype)) < 0) return -1;
    *d = g.d;
    return mgc_kspec_head_dim_ok(*d) ? 0 : -1;
}

int mgc_kspec_head_dim_ok(int64_t d) {
    return d >= 8 && d <= 256 && d % 8 == 0;
}

int64_t mgc_kspec_att_width(int64_t d) {
    return (d + 15) / 16 * 16;
}

int mgc_kspec_att_colsum(const mgc_plan_op *op, int dtype) {
    return op->kind == MGC_POP_ATTENTION_BWD && (op->flags & MGC_POF_QKV) &&
           (op->flags & MGC_POF_COLSUM) && op->n_out > 1 && dtype != MGC_DT_F32;
}

int mgc_kspec_att_dkv_slices(int64_t d, int half) {
    return half && mgc_kspec_att_width(d) > 128 ? 2 : 1;
}

/* MGC_ATT_POSITIONS=1: the kernels that compute positions (ROWPOS 0, context parallelism's)
 * even on one rank, so that test_cuda can replay them op by op against the CPU (docs/testing.md) */
static int getenv_positions(void) {
    const char *e = getenv("MGC_ATT_POSITIONS");
    return e && !strcmp(e, "1");
}

/* The tile knobs for A/B timings (scripts/gpu.sh quick), read by `mgc compile` and the backend
 * alike: MGC_ATT_FWD_KEYS=16|32|64, the 16-bit forward's keys a step at head dims to 128
 * (kernel constant FBK), MGC_ATT_DKV_ROWS=16|32|64, the 16-bit dK/dV kernel's query rows a
 * step at head dims to 64 (KVR), MGC_ATT_DKV_BUFS=1|2, its query-tile buffers past head dim
 * 64 to 128 (KVB), and MGC_ATT_FWD_BUFS=1|2, the forward's K/V buffers at 64 keys a step past
 * head dim 64 to 128 (FKVB), each in place of the kernel's own choice (attention.cuh
 * ATT_FBK_PP, ATT_TBC_KV, ATT_DKV_NB_PP, ATT_FWD_NB_PP; a buffers knob also leaves the kernel
 * no twin).  0 when unset or empty, -1 for any other value (mgc compile refuses it). */
const char *const mgc_kspec_att_tile_envs[MGC_KSPEC_ATT_TILE_ENVS] = {
    "MGC_ATT_FWD_KEYS", "MGC_ATT_DKV_ROWS", "MGC_ATT_DKV_BUFS", "MGC_ATT_FWD_BUFS"};

static int buffers_knob(const char *name) {
    return !strcmp(name, "MGC_ATT_DKV_BUFS") || !strcmp(name, "MGC_ATT_FWD_BUFS");
}

const char *mgc_kspec_att_tile_values(const char *name) {
    return buffers_knob(name) ? "1 or 2" : "16, 32 or 64";
}

int mgc_kspec_att_tile_env(const char *name) {
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    static const char *const sizes[] = {"16", "32", "64"}, *const bufs[] = {"1", "2"};
    int nb = buffers_knob(name);
    for (int i = 0; i < (nb ? 2 : 3); i++)
        if (!strcmp(e, nb ? bufs[i] : sizes[i])) return atoi(e);
    return -1;
}

/* out's constant cname from knob env where it applies (16 bits, head dim d past dmin to dmax):
 * 0, or -1 for a knob with a bad value */
static int tile_const(mgc_kspec *out, const char *env, const char *cname, int dt, int64_t d,
                      int64_t dmin, int64_t dmax) {
    if (dt == MGC_DT_F32 || d <= dmin || d > dmax) return 0;
    int v = mgc_kspec_att_tile_env(env);
    if (v < 0) return -1;
    if (v) mgc_kspec_const(out, cname, v);
    return 0;
}

int64_t mgc_kspec_att_fwd_keys(const mgc_kspec *k) {
    int64_t fbk = mgc_kspec_get(k, "FBK"), d = mgc_kspec_get(k, "D");
    if (fbk > 0) return fbk;
    if (d <= 32 || (d <= 128 && mgc_kspec_get(k, "DROP") != 1 && mgc_kspec_get(k, "DOCS") != 1 &&
                    mgc_kspec_get(k, "WIN") <= 0))
        return 64;
    return d <= 128 ? 32 : 16;
}

int mgc_kspec_twin(const mgc_kspec *k, mgc_kspec *twin) {
    if (strcmp(k->file, "attention.cuh") || k->dtype == MGC_DT_F32) return 0;
    int64_t d = mgc_kspec_get(k, "D");
    if (d <= 64 || d > 128) return 0;
    const char *cname = NULL;
    if (!strcmp(k->entry, "attention_fwd") && mgc_kspec_att_fwd_keys(k) == 64) cname = "FKVB";
    else if (!strcmp(k->entry, "attention_bwd_dkv")) cname = "KVB";
    if (!cname || mgc_kspec_get(k, cname) >= 0 || k->n_const >= MGC_KSPEC_MAX_CONST) return 0;
    *twin = *k;
    mgc_kspec_const(twin, cname, 1);
    return 1;
}

static void mask_consts(mgc_kspec *k, int64_t d, int64_t causal, int64_t drop, int64_t rowpos,
                        int docs, int64_t win) {
    mgc_kspec_const(mgc_kspec_const(k, "D", d), "CAUSAL", causal);
    mgc_kspec_const(mgc_kspec_const(k, "DROP", drop), "ROWPOS", rowpos);
    if (docs) mgc_kspec_const(k, "DOCS", 1);
    if (win > 0) mgc_kspec_const(k, "WIN", win);
}

int mgc_kspecs_attention(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                         mgc_kspec *out, int max) {
    (void)p;
    int dt = MGC_DT_F32;
    int64_t d = 0, causal = op->iattr[0] ? 1 : 0, drop = op->fattr[1] > 0 ? 1 : 0,
            rowpos = op->iattr[3] <= 1 && !getenv_positions() ? 1 : 0;
    int docs = (op->flags & MGC_POF_DOCS) != 0;
    if (op->kind != MGC_POP_ATTENTION && op->kind != MGC_POP_ATTENTION_BWD) return 0;
    /* the sliding window: a whole number of keys on a causal attention (plan_io.c checks it);
     * fattr[2] means something else on other ops (the MoE router's top-k scaling factor) */
    double wf = op->fattr[2];
    if (!(wf >= 0 && wf <= 16777216.0) || wf != (double)(int64_t)wf || (wf > 0 && !causal)) return -1;
    int64_t win = (int64_t)wf;
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_ATTENTION:
        if (attn_dims(ch, op, &dt, &d) || max < 1) return -1;
        mgc_kspec_init(&out[0], "attention.cuh", "attention_fwd", dt);
        mask_consts(&out[0], d, causal, drop, rowpos, docs, win);
        if (tile_const(&out[0], "MGC_ATT_FWD_KEYS", "FBK", dt, d, 0, 128)) return -1;
        /* the buffers only where the forward takes 64 keys a step (attention.cuh ATT_FBK_PP) */
        if (mgc_kspec_att_fwd_keys(&out[0]) != 64)
            return mgc_kspec_att_tile_env("MGC_ATT_FWD_BUFS") < 0 ? -1 : 1;
        return tile_const(&out[0], "MGC_ATT_FWD_BUFS", "FKVB", dt, d, 64, 128) ? -1 : 1;
    case MGC_POP_ATTENTION_BWD:
        if (attn_dims(ch, op, &dt, &d) || max < 2) return -1;
        mgc_kspec_init(&out[0], "attention.cuh", "attention_bwd_dq", dt);
        mask_consts(&out[0], d, causal, drop, rowpos, docs, win);
        mgc_kspec_init(&out[1], "attention.cuh", "attention_bwd_dkv", dt);
        mask_consts(&out[1], d, causal, drop, rowpos, docs, win);
        if (mgc_kspec_att_colsum(op, dt)) {
            mgc_kspec_const(&out[0], "CS", 1);
            mgc_kspec_const(&out[1], "CS", 1);
        }
        if (tile_const(&out[1], "MGC_ATT_DKV_BUFS", "KVB", dt, d, 64, 128)) return -1;
        return tile_const(&out[1], "MGC_ATT_DKV_ROWS", "KVR", dt, d, 0, 64) ? -1 : 2;
    default:
        return 0;
    }
}
