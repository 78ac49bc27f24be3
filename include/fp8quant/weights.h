/**
 * @file weights.h
 * @brief Per-block FP8 (e4m3) quantization of weights: one fp32 scale per block of
 *        `block_n x block_k` elements, as DeepSeek-V3 checkpoints store them
 *        (`weight_scale_inv`) and block-scaled GEMMs read them.
 *
 * Numerics follow SPEC.md section 3: for each block, `s = max(amax_finite, eps) / 448` (IEEE
 * division), optionally rounded up to a power of two (UE8M0, and the block is then quantized with
 * the rounded scale), and `q = saturate_e4m3(w / s)` rounded to nearest even. Blocks at the
 * right and bottom edges may be partial; their scale covers the elements they hold.
 */
#ifndef FP8QUANT_WEIGHTS_H_
#define FP8QUANT_WEIGHTS_H_

#include "fp8quant/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief Quantize `w [batch, n, k]` to float8_e4m3fn in blocks of `block_n x block_k`.
 *
 * Work is enqueued on `stream` of the current device; pointers must be device memory of that
 * device, and `q` and `scale` must not overlap each other or `w`. Arguments are validated first
 * (common.h); then, with `batch == 0` or `n == 0`, nothing is launched and no device is needed.
 * Strides of dimensions of size 0 or 1 are never used and may hold any value. The kernel waits for the
 * previous kernel in the stream before it touches global memory (programmatic dependent launch,
 * see fp8quant_set_pdl()).
 *
 * @param w               Input, last dimension contiguous.
 * @param w_dtype         Element type of `w`.
 * @param batch           Number of weights (experts; 1 for 2-D input), in [0, 65535].
 * @param n               Rows per weight, at most `65535 * block_n`.
 * @param k               Elements per row, in [1, 2^31 - 129].
 * @param w_batch_stride  Elements between batches of `w`, >= 0.
 * @param w_row_stride    Elements between rows of `w`, >= 0.
 * @param q               Output float8_e4m3fn values, last dimension contiguous.
 * @param q_batch_stride  Bytes between batches of `q`; batches must not overlap.
 * @param q_row_stride    Bytes between rows of `q`, >= k.
 * @param scale           Output fp32 scales, contiguous `[batch, ceil(n / block_n), ceil(k / block_k)]`.
 * @param block_n         Rows per block: 128.
 * @param block_k         Columns per block: 128.
 * @param ue8m0           Nonzero: round scales up to powers of two and quantize with them.
 * @param eps             Lower bound of each block's amax; finite and at least `FLT_MIN`.
 * @param stream          CUDA stream to enqueue on.
 */
FP8QUANT_API fp8quant_status_t fp8quant_per_block_quant(const void* w, fp8quant_dtype_t w_dtype, int64_t batch,
                                                        int64_t n, int64_t k, int64_t w_batch_stride,
                                                        int64_t w_row_stride, void* q, int64_t q_batch_stride,
                                                        int64_t q_row_stride, float* scale, int64_t block_n,
                                                        int64_t block_k, int ue8m0, float eps, cudaStream_t stream);

/**
 * @brief Requantize an fp8 weight with power-of-two scales: `w [batch, n, k]` float8_e4m3fn with
 *        fp32 block scales `w_scale` (a DeepSeek-V3 checkpoint's `weight` and
 *        `weight_scale_inv`), each element dequantized to `bfloat16(w * w_scale)` (the float32
 *        product rounded to nearest even), then quantized per block as
 *        fp8quant_per_block_quant() does with `ue8m0` set. This is how engines prepare such
 *        checkpoints for DeepGEMM on Blackwell; a block whose scale was already a power of two
 *        keeps its values exactly.
 *
 * Arguments, rules and launch as for fp8quant_per_block_quant(), with `w` in bytes (1 per
 * element) and these additions:
 *
 * @param w_scale  Input block scales, contiguous fp32 `[batch, ceil(n / block_n), ceil(k / block_k)]`,
 *                 4-byte aligned; must not overlap `q` or `scale`.
 */
FP8QUANT_API fp8quant_status_t fp8quant_requantize_ue8m0(const void* w, const float* w_scale, int64_t batch, int64_t n,
                                                         int64_t k, int64_t w_batch_stride, int64_t w_row_stride,
                                                         void* q, int64_t q_batch_stride, int64_t q_row_stride,
                                                         float* scale, int64_t block_n, int64_t block_k, float eps,
                                                         cudaStream_t stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FP8QUANT_WEIGHTS_H_
