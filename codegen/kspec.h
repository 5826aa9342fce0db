/* kspec.h - kernel specifications: which CUDA kernels a plan op needs, and
 * their source.
 *
 * A kernel spec names one template file of kernels/ (embedded in the build),
 * one entry point in it, the storage dtype and a handful of numbers (shapes,
 * eps, vector widths).  The compiler collects the specs of every op of a plan
 * (mgc_kspecs_for_op), generates each one's source (mgc_kspec_source: a thin
 * prologue of #defines, then the template) and compiles it with NVRTC for the
 * target architectures (nvrtc.c); the runtime calls the same
 * mgc_kspecs_for_op to find, by name, the cubins the plan carries, so the two
 * sides can never disagree about what a kernel is.  Only numbers reach the
 * generated source: no text from a YAML file does.
 *
 *     mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
 *     int n = mgc_kspecs_for_op(plan, chunk, op, k, MGC_KSPEC_MAX_PER_OP);
 *     char name[MGC_KSPEC_NAME_MAX];
 *     mgc_kspec_name(&k[0], name, sizeof name);   // "mgc_layernorm_fwd_bf16_H1024"
 *     char *src = mgc_kspec_source(&k[0]);         // malloc'd CUDA C++ source
 *
 * Template conventions (kernels/README.md): the prologue defines MGC_BF16 (0/1),
 * MGC_ENTRY_NAME (the spec's name, the kernel's extern "C" symbol) and one
 * `#define MGC_<CONST> value` per constant; the template includes
 * "mgc_common.cuh" and declares `extern "C" __global__ void MGC_ENTRY_NAME(...)`
 * for its entry (one template file may hold several entries, each compiled
 * under its own spec, selected by `#if MGC_ENTRY_<entry>`). */
#ifndef MGC_KSPEC_H
#define MGC_KSPEC_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MGC_KSPEC_MAX_CONST  8
#define MGC_KSPEC_MAX_PER_OP 6
#define MGC_KSPEC_NAME_MAX   192

typedef struct mgc_kspec {
    const char *file;  /* template in kernels/: "norm.cuh" */
    const char *text;  /* NULL (kernels/file's text), or the template's text itself: only
                          tests set it (tests/test_emu.c's deliberately broken kernels); the
                          compiler's specs name a file of kernels/ */
    const char *entry; /* entry point: "layernorm_fwd" (letters, digits, '_') */
    int dtype;         /* storage dtype of activations and weights: MGC_DT_F32, MGC_DT_BF16 or
                          MGC_DT_F16 (the prologue's MGC_BF16 / MGC_FP16) */
    int n_const;
    const char *const_name[MGC_KSPEC_MAX_CONST]; /* "H" -> #define MGC_H ... */
    int64_t const_val[MGC_KSPEC_MAX_CONST];
} mgc_kspec;

/* Adds a constant; returns the spec for chaining. */
mgc_kspec *mgc_kspec_const(mgc_kspec *k, const char *name, int64_t value);
/* A constant's value, -1 when the spec has none of that name (the launchers read theirs). */
int64_t mgc_kspec_get(const mgc_kspec *k, const char *name);
/* Initialises k for template `file`, entry `entry`, storage dtype (MGC_DT_BF16 or MGC_DT_F16;
 * anything else is fp32). */
void mgc_kspec_init(mgc_kspec *k, const char *file, const char *entry, int dtype);
/* The storage dtype a kernel spec takes for tensor dtype `dt`: fp32, bf16 or fp16 as they are,
 * -1 for any other (integers). */
int mgc_kspec_storage(int dt);

/* "mgc_<entry>_<f32|bf16|f16>[_<NAME><value>...]" (negative values spelt m<abs>). */
void mgc_kspec_name(const mgc_kspec *k, char *buf, size_t size);
/* The CUDA C++ source of the spec (prologue + template); malloc'd, NULL on OOM
 * or an unknown template. */
char *mgc_kspec_source(const mgc_kspec *k);
/* Embedded template text by file name ("mgc_common.cuh" included); NULL if unknown. */
const char *mgc_kernel_template(const char *file);

/* The kernels op `op` of chunk `ch` runs, written to out[0 .. return-1]
 * (0: the op needs none, e.g. a GEMM or a collective).  The order is the
 * launch order the runtime's launcher uses.  -1 when the op's shapes cannot
 * be served (the message, when err is not NULL). */
int mgc_kspecs_for_op(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                      mgc_kspec *out, int max, char *err, size_t errsz);
/* The kernels a plan runs outside its ops: the optimizer's (sum of squares, AdamW, the
 * gradients' zeroing), then the folds of its reductions when it has more than one rank
 * (mgc_kspec_fold). */
int mgc_kspecs_for_plan(const mgc_plan *p, mgc_kspec *out, int max);

/* Per-family spec functions (kspec_<family>.c), called by mgc_kspecs_for_op. */
int mgc_kspecs_pointwise(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                         mgc_kspec *out, int max);
/* Whether the norm backward over rows of h elements of storage dtype `dt` can also sum the
 * columns of dx (constant CS; compiler/fusion.c asks before it moves a linear's bias gradient
 * there): only where a thread holds its row, one vector (h <= 8192), and its block leaves it
 * the registers the three sums of columns need: 72 in 16 bits (bf16 spilled 44 bytes at 64
 * from H 7424 to 7936, though not at 8192), 100 in fp32 (H 5376 spilled 28 bytes at 97). */
int mgc_kspec_norm_colsum_fits(int64_t h, int dt);
int mgc_kspecs_attention(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                         mgc_kspec *out, int max);
/* The shapes the CUDA kernels serve, where a model's config can exceed them: mgc check warns
 * from these (compiler/check.c, check_kernels), and the spec functions refuse the same.
 *   head dim: a multiple of 8 from 8 to 256 (attention.cuh: 16-byte rows of 16-bit values,
 *             k-steps of 16 on tensor cores over D rounded up to 16; past 128 the backward's
 *             tiles take dynamic shared memory and the 16-bit dK/dV kernel computes half the
 *             columns a block, D = 256's the most that fit registers and 99 KiB);
 *   router:   up to 1,024 experts and a top-k of at most 64 (moe.cuh: a warp a token). */
int mgc_kspec_head_dim_ok(int64_t d);
/* The width the attention kernels compute over: head dim d rounded up to the mma k-step of 16
 * (attention.cuh ATT_W; an odd multiple of 8 does the next multiple of 16's work).  The
 * launcher's tile sizes and the cost model's attention price use it. */
int64_t mgc_kspec_att_width(int64_t d);
/* The blocks the 16-bit dK/dV kernel takes a key tile: 2 past a width of 128, each computing
 * half of dK's and dV's columns (and all of S and dP: 9 tile products where 7), else 1
 * (attention.cuh ATT_DKV_NS).  fp32 (half = 0): 1. */
int mgc_kspec_att_dkv_slices(int64_t d, int half);
/* Whether attention_bwd op's kernels (storage dtype) sum the QKV projection's bias gradient
 * themselves (constant CS: a fused-qkv op with MGC_POF_COLSUM in 16 bits; attention.cuh
 * att_colsum), into MGC_KSPEC_ATT_CS_ROWS-row tiles of partials.  An fp32 plan's op with the
 * flag has the launcher sum dqkv after the kernels instead. */
#define MGC_KSPEC_ATT_CS_ROWS 64
int mgc_kspec_att_colsum(const mgc_plan_op *op, int dtype);
/* The partials of that sum: (b ceil(s / MGC_KSPEC_ATT_CS_ROWS), width) fp32, width the qkv
 * rows' (A + 2G) d; kspec_scratch.c. */
uint64_t mgc_kspec_att_cs_bytes(int64_t s, int64_t b, int64_t width);
/* The attention tile knobs in the environment, for A/B timings: MGC_ATT_FWD_KEYS (the 16-bit
 * forward's keys a step at head dims to 128, kernel constant FBK; attention.cuh ATT_FBK_PP),
 * MGC_ATT_DKV_ROWS (the 16-bit dK/dV kernel's query rows a step at head dims to 64, KVR;
 * ATT_TBC_KV), MGC_ATT_DKV_BUFS (its query-tile buffers past head dim 64 to 128, KVB;
 * ATT_DKV_NB_PP) and MGC_ATT_FWD_BUFS (the 16-bit forward's K/V buffers at 64 keys a step past
 * head dim 64 to 128, FKVB; ATT_FWD_NB_PP).  mgc_kspec_att_tile_env(name): the value (16, 32
 * or 64; for the buffers 1 or 2, as mgc_kspec_att_tile_values says); 0 unset (the kernel's
 * own choice); -1 any other value (the attention's kernel specs then fail, and `mgc compile`
 * says why). */
#define MGC_KSPEC_ATT_TILE_ENVS 4
extern const char *const mgc_kspec_att_tile_envs[MGC_KSPEC_ATT_TILE_ENVS];
int mgc_kspec_att_tile_env(const char *name);
const char *mgc_kspec_att_tile_values(const char *name);
/* The 16-bit attention forward's keys a step (attention.cuh ATT_FBK_PP) of spec k: its
 * constant FBK when set (MGC_ATT_FWD_KEYS); else 64 to head dim 32, and to 128 without dropout,
 * documents or a window; 32 to 128 with them; 16 past 128. */
int64_t mgc_kspec_att_fwd_keys(const mgc_kspec *k);
/* A kernel's twin for GPUs with less shared memory: the same kernel with one buffer of the
 * tiles it double-buffers in dynamic shared memory, where that leaves one block a
 * multiprocessor on the GPUs with 100 KB (sm_86, sm_89, sm_120), with the same bits.  So far
 * the 16-bit attention forward at 64 keys a step and dK/dV kernel past head dim 64 to 128
 * (69,632 and 52,224 bytes at 128; their twins' static 34,944 and 43,776), when no knob chose
 * their buffers.  1 and *twin set, or 0 (none).  `mgc compile` puts both in the plan; the
 * launcher takes the twin where the device's shared memory holds more blocks of it
 * (runtime/cuda_ops_attention.c; the cubin is chosen by the GPU's major version, which does
 * not tell an A100 from an L40S). */
int mgc_kspec_twin(const mgc_kspec *k, mgc_kspec *twin);
int mgc_kspec_router_ok(int64_t experts, int64_t topk);
int mgc_kspecs_moe(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                   mgc_kspec *out, int max);
/* ---- kernel scratch (kspec_scratch.c) ------------------------------------------------------
 * Launchers of the CUDA backend carve the device scratch their kernels need (partial sums, row
 * statistics, sort keys, the MoE dispatch map) from the plan's `kernel_scratch` buffer, which the
 * memory plan sizes with these functions: the arena stays the one device allocation of a rank.
 * The runtime's launchers and the plan share the constants and sizes below. */
#define MGC_KSPEC_NORM_NB      256   /* norm backward: blocks of partial sums (fixed: bits independent of the GPU) */
#define MGC_KSPEC_SUMSQ_NB     1024  /* sum of squares: most blocks of partial sums (by sizes only) */
#define MGC_KSPEC_OPT_CHUNK    8192  /* optimizer: elements a chunk (a block's unit of work) */
#define MGC_KSPEC_SQ_LIST      128   /* sum of squares: tensors a launch (kernel-parameter table) */
#define MGC_KSPEC_AW_LIST      48    /* AdamW: tensors a launch (kernel-parameter table) */
#define MGC_KSPEC_EMB_SORT_MAX (1 << 30) /* embedding backward: most tokens a microbatch (the sort's int indices) */
#define MGC_KSPEC_EMB_SEG      32    /* embedding backward: sorted keys a block (kernels/embedding.cuh) */
#define MGC_KSPEC_EMB_SORT_TILES 128 /* embedding sort: most tiles (blocks) of a pass */
#define MGC_KSPEC_EMB_BSORT_MAX 8192 /* embedding sort: most keys sorted in one block (embedding_sort_block) */
#define MGC_KSPEC_BGRAD_PARTS  256   /* bias gradient: most row partitions (kernels/gemm_aux.cuh) */
#define MGC_KSPEC_MOE_TILE     256   /* kernels/moe.cuh: assignments per map block */
/* A carve's size: bytes rounded up to 256 (every carve starts 256-aligned). */
uint64_t mgc_kspec_align(uint64_t bytes);
/* The MoE dispatch map of nk assignments to E experts (capacity cap, 0: none; probs: capacity
 * decided by probability, two passes). */
uint64_t mgc_kspec_moe_map_bytes(int64_t nk, int64_t E, int64_t cap, int probs);
/* The bias gradient's row partitions of an M-row dy: at most MGC_KSPEC_BGRAD_PARTS of
 * *rows (a multiple of 8, about 32 or more: every row lane of kernels/gemm_aux.cuh's
 * bias_grad_partial loads its 4 rows at once) each; returns their number. */
int64_t mgc_kspec_bias_grad_parts(int64_t M, int64_t *rows);
/* The embedding sort's tiles of n keys: at most MGC_KSPEC_EMB_SORT_TILES of *per chunks of
 * 256 keys each; returns their number (kernels/embedding.cuh embedding_sort). */
int64_t mgc_kspec_emb_sort_tiles(int64_t n, int64_t *per);
/* The sorted embedding backward's: n sort keys twice (the radix sort's two buffers), a tile's
 * 256 digit counts, then an fp32 row of h a segment of keys. */
uint64_t mgc_kspec_emb_sort_bytes(int64_t n, int64_t h);
/* The most scratch bytes the CUDA launchers of op `op` ask for in one call (0: none). */
uint64_t mgc_kspec_op_scratch_bytes(const mgc_plan_chunk *ch, const mgc_plan_op *op);
/* The optimizer's (the sum of squares' partials and result). */
uint64_t mgc_kspec_optimizer_scratch_bytes(void);

/* The optimizer's kernels (sum of squares, AdamW, the gradients' zeroing) for a plan whose
 * weights are `dtype` (fp32, bf16 or fp16: AdamW's 16-bit copy-out writes that type); the
 * order is fixed: see kspec_pointwise.c. */
int mgc_kspecs_optimizer(int dtype, mgc_kspec *out, int max);
/* The fold of reductions on device memory (kernels/comm.cuh) for storage `dtype`.  A plan of
 * more than one rank carries it for fp32 (gradients) and its 16-bit type if any. */
void mgc_kspec_fold(int dtype, mgc_kspec *out);

#ifdef __cplusplus
}
#endif
#endif /* MGC_KSPEC_H */
