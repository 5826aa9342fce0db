/* rng.h - counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11).
 *
 * A counter-based generator has no state: the random word is a pure function of
 * (key, counter), so any element's number can be produced on its own, in any order,
 * on any rank, and recompute regenerates exactly the mask the forward used.
 *
 *     key     = the 64-bit training seed (two 32-bit words)
 *     counter = (element index lo, hi, stream lo, hi)
 *     stream  = mgc_rng_stream(layer, site, microbatch)
 *
 * One Philox call yields four 32-bit words; element i uses word i % 4 of counter i / 4.
 * The helpers below are pure functions: no globals, no threads, bit-identical everywhere. */
#ifndef MGC_RNG_H
#define MGC_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The 10-round Philox-4x32 bijection: out = philox(key, ctr). */
void mgc_rng_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A stream id for one dropout site: (layer + 1) in bits 40..63 (layer -1 = embedding / head),
 * site (0..255: which dropout of the layer) in bits 32..39, microbatch in bits 0..31. */
uint64_t mgc_rng_stream(int32_t layer, uint32_t site, uint32_t microbatch);

/* The step's part of a dropout stream (backend.h mgc_op_dropout_stream XORs it in): a GPU
 * kernel computes it from the step's number in device memory (kernels/mgc_common.cuh
 * mgc_step_stream, the same product), so a recorded CUDA graph draws every step's masks. */
static inline uint64_t mgc_rng_step_mix(int64_t step) {
    return (uint64_t)step * 0x9E3779B97F4A7C15ull;
}

/* FNV-1a 64 of a name: the stream of a named thing (a parameter's initial values, a
 * dropout site).  "" and NULL hash to the offset basis. */
uint64_t mgc_rng_name_hash(const char *name);

/* The 32-bit random word of element `index` of `stream` under `seed`. */
uint32_t mgc_rng_u32(uint64_t seed, uint64_t stream, uint64_t index);

/* Fill out[0..n) with the words of elements elem0 .. elem0+n-1 (the same values as
 * mgc_rng_u32 one by one; elem0 lets a shard regenerate its slice of a global mask). */
void mgc_rng_fill_u32(uint32_t *out, int64_t n, uint64_t seed, uint64_t stream, uint64_t elem0);

/* Dropout keep threshold: an element is kept iff its word >= mgc_rng_drop_threshold(p),
 * i.e. with probability 1 - p (exact to 2^-32). p in [0, 1). */
uint32_t mgc_rng_drop_threshold(double p);

/* Dropout randomness of one site.  Element-wise dropout: local element i is element
 * elem0 + i of the stream, or elem1 + (i - n0) when n0 > 0 and i >= n0 (a context-parallel
 * shard holds two runs of the sequence: backend.h mgc_op_drop_rng).  Attention dropout:
 * probability (bi, a, i, j) is element elem0 + ((bi*heads + head0 + a)*seq + qpos(i))*seq +
 * kpos(j), the global head and positions, so every layout draws the same mask; heads = 0
 * numbers locally, ((bi*A + a)*sq + i)*sk + j.  All-zero past `elem0` is the unsharded site. */
typedef struct mgc_dropout_rng {
    uint64_t seed;   /* training seed */
    uint64_t stream; /* mgc_op_dropout_stream */
    uint64_t elem0;  /* global index of this shard's first element (0 unsharded) */
    int64_t n0;      /* elements of the first run (0: one run) */
    uint64_t elem1;  /* global index of the second run's first element */
    int64_t heads;   /* attention: the model's query heads (0: local numbering) */
    int64_t head0;   /* attention: global index of local head 0 */
    int64_t seq;     /* attention: the whole sequence length */
} mgc_dropout_rng;

/* The word as a uniform float in [0, 1) with 24 random bits. */
static inline float mgc_rng_uniform_f32(uint32_t w) {
    return (float)(w >> 8) * (1.0f / 16777216.0f);
}

#ifdef __cplusplus
}
#endif
#endif
