/* gemm_aux.cuh - what cuBLASLt's epilogues do not: a bias added after the GEMM
 * (when the bias type differs from the output type), and the bias gradient
 * (column sums of dy) added deterministically into an fp32 gradient. */
#include "mgc_common.cuh"

#if defined(MGC_ENTRY_bias_add)
/* y (M, N) += bias (N).  grid ceil(M*N/256), block 256. */
extern "C" __global__ void MGC_ENTRY_NAME(mgc_t *y, const mgc_t *bias, i64 M, i64 N) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    y[i] = mgc_st(mgc_ld(y[i]) + mgc_ld(bias[i % N]));
}
#endif

#if defined(MGC_ENTRY_bias_grad_partial)
/* part (chunks, N) = column sums of dy over rows [256 c, 256 c + 256).
 * grid (ceil(N/256), chunks), block 256: one column per thread, rows in order. */
extern "C" __global__ void MGC_ENTRY_NAME(float *part, const mgc_t *dy, i64 M, i64 N) {
    i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (col >= N) return;
    i64 r0 = c * 256, r1 = r0 + 256 < M ? r0 + 256 : M;
    float s = 0.0f;
    for (i64 r = r0; r < r1; r++) s += mgc_ld(dy[r * N + col]);
    part[c * N + col] = s;
}
#endif

#if defined(MGC_ENTRY_bias_grad_finish)
/* db (N) += sum over chunks of part (chunks, N), chunks in order.
 * grid ceil(N/256), block 256. */
extern "C" __global__ void MGC_ENTRY_NAME(float *db, const float *part, i64 chunks, i64 N) {
    i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= N) return;
    float s = 0.0f;
    for (i64 c = 0; c < chunks; c++) s += part[c * N + col];
    db[col] += s;
}
#endif
