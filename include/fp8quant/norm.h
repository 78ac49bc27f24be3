/**
 * @file norm.h
 * @brief RMSNorm of activation rows, after an optional residual add, written in the input's
 *        dtype or quantized to FP8 in groups straight into a GEMM's scale layout: the
 *        normalized activation never makes a round trip through memory.
 *
 * Numerics (docs/contract.md, "RMSNorm"), for a row of `h` elements of x's dtype T:
 * `h = x + residual` summed in float32 and rounded to T (written back into `residual`); the
 * sum of squares in float32 in a fixed order; `r = 1 / sqrt(sum / h + eps)` (IEEE square root
 * and divisions); `y = (h * r rounded to T) * weight`, rounded to T. fp8quant_rms_norm_quant()
 * then quantizes y exactly as fp8quant_per_token_group_quant() would, so it writes the bytes of
 * fp8quant_rms_norm() followed by the quantizer.
 */
#ifndef FP8QUANT_NORM_H_
#define FP8QUANT_NORM_H_

#include "fp8quant/common.h"
#include "fp8quant/mx.h"
#include "fp8quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief `y = rms_norm(x + residual) * weight` of `x [m, h]`, in x's dtype.
 *
 * Work is enqueued on `stream` of the current device; pointers are device memory of that device,
 * 16-byte aligned, and every row stride a multiple of 8 elements (16 bytes). `residual` may be
 * null; otherwise it is read, then overwritten with `x + residual` (rounded to x's dtype). `y`
 * and `residual` must not overlap each other, `x` or `weight`. With `m == 0` nothing is launched.
 * The kernel waits for the previous kernel in the stream before it touches memory
 * (programmatic dependent launch, see fp8quant_set_pdl()).
 *
 * @param x                    Input `[m, h]`, last dimension contiguous.
 * @param residual             In/out `[m, h]` of x's dtype, or null.
 * @param weight               `[h]` of x's dtype, contiguous.
 * @param dtype                FP8QUANT_DTYPE_BFLOAT16 or FP8QUANT_DTYPE_FLOAT16.
 * @param m                    Rows, in [0, 2^31 - 4].
 * @param h                    Elements per row: a positive multiple of 16, at most 16384.
 * @param x_row_stride         Elements between rows of `x`, >= 0.
 * @param residual_row_stride  Elements between rows of `residual`, >= h.
 * @param eps                  Added to the mean square; finite and >= 0.
 * @param y                    Output `[m, h]` of x's dtype.
 * @param y_row_stride         Elements between rows of `y`, >= h.
 * @param stream               CUDA stream to enqueue on.
 */
FP8QUANT_API fp8quant_status_t fp8quant_rms_norm(const void* x, void* residual, const void* weight,
                                                 fp8quant_dtype_t dtype, int64_t m, int64_t h, int64_t x_row_stride,
                                                 int64_t residual_row_stride, float eps, void* y, int64_t y_row_stride,
                                                 cudaStream_t stream);

/**
 * @brief fp8quant_rms_norm() fused with fp8quant_per_token_group_quant(): `y` is not written
 *        but quantized to float8_e4m3fn `q [m, h]` in groups of `group_size`, with the scales
 *        in `scale_layout` (padding rows and groups written as 0).
 *
 * Requirements as fp8quant_rms_norm(), with `q` and `scale` in place of `y`: `q` 16-byte
 * aligned with a row stride (bytes) a multiple of 16; `scale` 4-byte aligned with
 * `fp8quant_scale_shape(scale_layout, 1, m, h / group_size).numel` elements; no two of `q`,
 * `scale`, `residual` overlapping, nor any of them `x` or `weight`.
 *
 * @param q             Output float8_e4m3fn `[m, h]`, last dimension contiguous.
 * @param q_row_stride  Bytes between rows of `q`, >= h.
 * @param scale         Output scales (see ::fp8quant_scale_layout_t).
 * @param scale_layout  Layout (and dtype) of `scale`.
 * @param ue8m0         Nonzero: round scales up to powers of two; required for
 *                      FP8QUANT_SCALE_PACKED_UE8M0.
 * @param group_size    32, 64 or 128; must divide h.
 * @param quant_eps     Lower bound of each group's amax (fp8quant_per_token_group_quant()'s
 *                      `eps`): finite and at least `FLT_MIN`.
 * The other parameters are fp8quant_rms_norm()'s.
 */
FP8QUANT_API fp8quant_status_t fp8quant_rms_norm_quant(const void* x, void* residual, const void* weight,
                                                       fp8quant_dtype_t dtype, int64_t m, int64_t h,
                                                       int64_t x_row_stride, int64_t residual_row_stride, float eps,
                                                       void* q, int64_t q_row_stride, void* scale,
                                                       fp8quant_scale_layout_t scale_layout, int ue8m0,
                                                       int64_t group_size, float quant_eps, cudaStream_t stream);

/**
 * @brief fp8quant_rms_norm() fused with fp8quant_mxfp8_quant(): `y` is not written but quantized
 *        to MXFP8, `q [m, h]` float8_e4m3fn and one E8M0 byte per group of 32 in `scale`
 *        (docs/contract.md, "MXFP8"), bit for bit the bytes of the two ops one after the other.
 *
 * Requirements as fp8quant_rms_norm_quant(), with `h` a multiple of 32 and `scale` the whole
 * buffer of fp8quant_mx_scale_bytes(scale_layout, 1, m, h / 32) bytes (padding written as 0).
 * The block per row has no limit on scale slots (fp8quant_mxfp8_quant()'s does not apply); with
 * the swizzled layout, whose rows (padded to 128) go on grid.x, `m` is at most 2^31 - 128.
 *
 * @param scale_layout  Layout of `scale`.
 * @param recipe        Scale recipe.
 * The other parameters are fp8quant_rms_norm_quant()'s.
 */
FP8QUANT_API fp8quant_status_t fp8quant_rms_norm_mxfp8(const void* x, void* residual, const void* weight,
                                                       fp8quant_dtype_t dtype, int64_t m, int64_t h,
                                                       int64_t x_row_stride, int64_t residual_row_stride, float eps,
                                                       void* q, int64_t q_row_stride, void* scale,
                                                       fp8quant_mx_scale_layout_t scale_layout,
                                                       fp8quant_mx_recipe_t recipe, cudaStream_t stream);

/**
 * @brief fp8quant_rms_norm() fused with fp8quant_nvfp4_quant(): `y` quantized to NVFP4,
 *        `q [m, h / 2]` (two e2m1 codes a byte) and one e4m3 byte per group of 16 in `scale`,
 *        with the encode scale read from `global_scale` (docs/contract.md, "NVFP4").
 *
 * Requirements as fp8quant_rms_norm_mxfp8(), with `h` a multiple of 16 (`h / 16` groups, `scale`
 * of fp8quant_mx_scale_bytes(scale_layout, 1, m, h / 16) bytes) and:
 *
 * @param q             Output `[m, h / 2]` bytes, 8-byte aligned (a thread's 16 elements are 8
 *                      bytes), last dimension contiguous.
 * @param q_row_stride  Bytes between rows of `q`: a multiple of 8, >= h / 2.
 * @param global_scale  Device float32 encode scale `S` of y (a calibrated value: the op does not
 *                      see y's amax before it quantizes), 4-byte aligned, apart from the outputs.
 */
FP8QUANT_API fp8quant_status_t fp8quant_rms_norm_nvfp4(const void* x, void* residual, const void* weight,
                                                       fp8quant_dtype_t dtype, int64_t m, int64_t h,
                                                       int64_t x_row_stride, int64_t residual_row_stride, float eps,
                                                       void* q, int64_t q_row_stride, void* scale,
                                                       fp8quant_mx_scale_layout_t scale_layout,
                                                       const float* global_scale, cudaStream_t stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FP8QUANT_NORM_H_
