/* gemm_aux.cuh - what cuBLASLt's epilogues do not: a bias added after the GEMM
 * (when the bias type differs from the output type), and the bias gradient
 * (column sums of dy) added deterministically into an fp32 gradient. */
#include "mgc_common.cuh"

#if defined(MGC_ENTRY_bias_add)
/* y (M, N) += bias (N).  grid ceil(M*N/256), block 256. */
extern "C" __global__ void MGC_ENTRY_NAME(mgc_t *y, const mgc_t *bias, i64 M, i64 N) {
    mgc_pdl_begin();
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    y[i] = mgc_st(mgc_ld(y[i]) + mgc_ld(bias[i % N]));
}
#endif

#if defined(MGC_ENTRY_bias_grad_partial)
/* part (P, N) = column sums of dy (M, N) over row partitions of RP rows (partition p: rows
 * [p RP, p RP + RP)).  grid (ceil(N / 256), P), block 256: 8 row lanes of 32 column lanes, a
 * column lane owning 8 adjacent columns (one 16-byte load of a 16-bit row when vec: N % 8 == 0
 * and dy 16-byte aligned; element by element otherwise).  Row lane l adds rows p RP + l,
 * + 8, + 16, ... in order, U rows read ahead of their additions; the 8 lanes' sums are then
 * added in lane order.  The order depends on M, N and RP only (kspec.h
 * mgc_kspec_bias_grad_parts), never on the GPU. */
#define MGC_BG_U 4
extern "C" __global__ void __launch_bounds__(256) MGC_ENTRY_NAME(float *__restrict__ part,
        const mgc_t *__restrict__ dy, i64 M, i64 N, i64 RP, int vec) {
    mgc_pdl_begin();
    __shared__ float sh[8][257];
    int cl = threadIdx.x & 31, rl = threadIdx.x >> 5;
    i64 c0 = (i64)blockIdx.x * 256 + cl * 8, p = blockIdx.y;
    i64 r0 = p * RP + rl, r1 = p * RP + RP < M ? p * RP + RP : M;
    int nv = c0 < N ? (N - c0 < 8 ? (int)(N - c0) : 8) : 0;
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j] = 0.0f;
    for (i64 r = r0; r < r1; r += 8 * MGC_BG_U) {
        float x[MGC_BG_U][8];
#pragma unroll
        for (int u = 0; u < MGC_BG_U; u++) {
            i64 q = r + 8 * u;
            const mgc_t *row = dy + (q < r1 ? q : r0) * N + c0;
            if (vec && nv == 8) mgc_ld8(row, x[u]);
            else mgc_ld8_part(row, nv, x[u]);
        }
#pragma unroll
        for (int u = 0; u < MGC_BG_U; u++)
            if (r + 8 * u < r1)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[j] += x[u][j];
    }
#pragma unroll
    for (int j = 0; j < 8; j++) sh[rl][cl * 8 + j] = acc[j];
    __syncthreads();
    i64 col = (i64)blockIdx.x * 256 + threadIdx.x;
    if (col >= N) return;
    float s = 0.0f;
#pragma unroll
    for (int l = 0; l < 8; l++) s += sh[l][threadIdx.x];
    part[p * N + col] = s;
}
#endif

#if defined(MGC_ENTRY_bias_grad_finish)
/* db (N) += sum over chunks of part (chunks, N), chunks in order.
 * grid ceil(N/256), block 256. */
extern "C" __global__ void MGC_ENTRY_NAME(float *db, const float *part, i64 chunks, i64 N) {
    mgc_pdl_begin();
    i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= N) return;
    float s = 0.0f;
#pragma unroll 8
    for (i64 c = 0; c < chunks; c++) s += part[c * N + col];
    db[col] += s;
}
#endif
