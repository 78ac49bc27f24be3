/**
 * @file moe.h
 * @brief Mixture-of-experts data movement around the grouped GEMMs. This header has the combine
 *        step: each token's expert outputs, weighted by the router and summed.
 *
 * Numerics (docs/contract.md, "MoE"): `out[t] = sum_j weights[t, j] * y[rows[t, j]]` over
 * `j = 0 .. k-1` in that order, each product and each sum rounded in float32 (no fused
 * multiply-add), rounded once to y's dtype (round to nearest even).
 */
#ifndef FP8QUANT_MOE_H_
#define FP8QUANT_MOE_H_

#include "fp8quant/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief Combine expert outputs: `out [t, h] = sum_j weights[t, j] * y[rows[t, j], :]`.
 *
 * Work is enqueued on `stream` of the current device; pointers are device memory of that device
 * and `out` must not overlap `y`, `rows` or `weights`. Arguments are validated first; with
 * `t == 0` nothing is launched. The kernel waits for the previous kernel in the stream before
 * it touches memory (programmatic dependent launch, see fp8quant_set_pdl()).
 *
 * @param y               Expert outputs `[y_rows, h]`, last dimension contiguous: the contiguous
 *                        layout's `[M_sum, h]`, or the masked layout's `[E, max_m, h]` seen as
 *                        `E * max_m` rows.
 * @param y_dtype         Element type of `y` and `out`.
 * @param y_rows          Rows of `y`, >= 0.
 * @param h               Elements per row, > 0.
 * @param y_row_stride    Elements between rows of `y`, >= 0.
 * @param rows            int32 `[t, k]`, contiguous: the row of `y` each slot reads
 *                        (`inv_perm`, or `masked_row` for the masked layout). A row outside
 *                        `[0, y_rows)`, such as the -1 of a dropped slot, contributes nothing.
 * @param weights         fp32 `[t, k]`, contiguous: the router's weights.
 * @param t               Tokens, >= 0.
 * @param k               Slots per token, in [1, 1024].
 * @param out             Output `[t, h]` of `y_dtype`, last dimension contiguous.
 * @param out_row_stride  Elements between rows of `out`, >= h.
 * @param stream          CUDA stream to enqueue on.
 */
FP8QUANT_API fp8quant_status_t fp8quant_moe_combine(const void* y, fp8quant_dtype_t y_dtype, int64_t y_rows, int64_t h,
                                                    int64_t y_row_stride, const int32_t* rows, const float* weights,
                                                    int64_t t, int64_t k, void* out, int64_t out_row_stride,
                                                    cudaStream_t stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FP8QUANT_MOE_H_
