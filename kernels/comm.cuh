/* comm.cuh - the fold of a reduction on device memory.  A moves-only communicator
 * (runtime/comm.h: NCCL) composes every all-reduce and reduce-scatter from all-to-alls and
 * this fold: each rank receives every rank's part of its slice, `parts` arrays of `count`
 * elements `stride` apart, and folds them in group-rank order.
 *
 * Entries (launcher: runtime/cuda_ops_pointwise.c mgc_cuda_fold):
 *   fold    dst[i] = op over j = 0 .. parts-1, in that order, of src[j * stride + i], in fp32,
 *           rounded once to the storage type; op 0 sum, 1 max (a NaN operand makes NaN).
 *           runtime/comm.c mgc_comm_fold_host's arithmetic bit for bit (fp32 adds: nothing to
 *           contract).  Grid-stride over items of 8 elements, vectors where aligned; any grid
 *           gives the same bits.
 * Specs: fp32 (gradients, always) and the plan's 16-bit type (activations), one each. */
#include "mgc_common.cuh"

#if defined(MGC_ENTRY_fold)
__device__ __forceinline__ float mgc_fold_op(float a, float v, int op) {
    if (op == 0) return __fadd_rn(a, v);
    return v > a || v != v ? (a != a ? a : v) : a; /* max; a NaN operand makes NaN */
}

/* Grid-stride over items of 8 consecutive elements: 16-byte accesses (bf16/fp16; two of fp32)
 * when dst, src and the parts' stride keep every vector 16-byte aligned (comm.c pads each part
 * to whole vectors, and an all-reduce's slices are whole vectors), else, and for the last
 * partial item, element by element.  The same arithmetic either way. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dst, const mgc_t *__restrict__ src, int parts, i64 count,
                   i64 stride, int op) {
    mgc_pdl_begin();
    const bool ok8 = mgc_al16(dst) && mgc_al16(src) && stride % 8 == 0;
    for (i64 v = (i64)blockIdx.x * blockDim.x + threadIdx.x; v * 8 < count;
         v += (i64)gridDim.x * blockDim.x) {
        const i64 left = count - 8 * v;
        const int nv = left < 8 ? (int)left : 8;
        const bool vec = ok8 && nv == 8;
        float a[8], b[8];
        if (vec) mgc_ld8(src + 8 * v, a);
        else mgc_ld8_part(src + 8 * v, nv, a);
        for (int j = 1; j < parts; j++) {
            if (vec) mgc_ld8(src + (i64)j * stride + 8 * v, b);
            else mgc_ld8_part(src + (i64)j * stride + 8 * v, nv, b);
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] = mgc_fold_op(a[e], b[e], op);
        }
        if (vec) mgc_st8(dst + 8 * v, a);
        else mgc_st8_part(dst + 8 * v, nv, a);
    }
}
#endif
