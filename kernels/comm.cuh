/* comm.cuh - the fold of a reduction on device memory.  A moves-only communicator
 * (runtime/comm.h: NCCL) composes every all-reduce and reduce-scatter from all-to-alls and
 * this fold: each rank receives every rank's part of its slice, `parts` arrays of `count`
 * elements `stride` apart, and folds them in group-rank order.
 *
 * Entries (launcher: runtime/cuda_ops_pointwise.c mgc_cuda_fold):
 *   fold    dst[i] = op over j = 0 .. parts-1, in that order, of src[j * stride + i], in fp32,
 *           rounded once to the storage type; op 0 sum, 1 max (a NaN operand makes NaN).
 *           runtime/comm.c mgc_comm_fold_host's arithmetic bit for bit (fp32 adds: nothing to
 *           contract).  Grid-stride over count; any grid gives the same bits.
 * Specs: fp32 (gradients, always) and the plan's 16-bit type (activations), one each. */
#include "mgc_common.cuh"

#if defined(MGC_ENTRY_fold)
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dst, const mgc_t *__restrict__ src, int parts, i64 count,
                   i64 stride, int op) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (i64)gridDim.x * blockDim.x) {
        float a = mgc_ld(src[i]);
        for (int j = 1; j < parts; j++) {
            float v = mgc_ld(src[(i64)j * stride + i]);
            if (op == 0) a = __fadd_rn(a, v);
            else if (v > a || v != v) a = a != a ? a : v;
        }
        dst[i] = mgc_st(a);
    }
}
#endif
