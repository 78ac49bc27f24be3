/**
 * @file mx.h
 * @brief Block-scaled quantization for Blackwell's tensor cores, one scale byte per group in
 *        row-major order or in the swizzled layout they read (cuBLASLt, CUTLASS,
 *        `torch._scaled_mm`):
 *        - MXFP8: groups of 32, float8_e4m3fn values, an E8M0 scale byte;
 *        - NVFP4: groups of 16, e2m1 values two to a byte, an e4m3 scale byte, times a float32
 *          encode scale per tensor or per batch.
 *
 * Numerics: docs/contract.md, "MXFP8" and "NVFP4". MXFP8: `amax` over the group's finite
 * elements, no epsilon; the scale byte `e` by the recipe (RCEIL: the smallest power of two at or
 * above `RN(amax / 448)`, capped at 254; FLOOR: `exponent(amax) - 8`, clamped to [0, 254]); then
 * `q = saturate_e4m3(x / 2^(e - 127))` rounded to nearest even (NaN stays NaN). NVFP4, every
 * division IEEE: `s = e4m3(RN(RN(amax / 6) * S))`, `q = e2m1(RN(x * RN(S / s)))` (0 when `s` is 0).
 */
#ifndef FP8QUANT_MX_H_
#define FP8QUANT_MX_H_

#include "fp8quant/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Where the scale bytes of a `[batch, m, k]` input go (`G` groups per row: `k / 32` for MXFP8,
 *  `k / 16` for NVFP4). */
typedef enum FP8QUANT_ENUM_BASE {
  /** Row-major `[batch, m, G]`, `m * G` bytes per batch. */
  FP8QUANT_MX_SCALE_ROW = 0,
  /** Swizzled, per batch a buffer of `round_up(m, 128) * round_up(G, 4)` bytes: scale `(r, c)`
   *  at byte `(r / 128) * ceil(G / 4) * 512 + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4
   *  + c % 4`; every other byte is written as 0. */
  FP8QUANT_MX_SCALE_SWIZZLED = 1,
} fp8quant_mx_scale_layout_t;

/** How a group's E8M0 scale byte follows from its amax. */
typedef enum FP8QUANT_ENUM_BASE {
  /** NVIDIA's: the smallest power of two at or above `RN(amax / 448)` (`cvt.rp.satfinite.ue8m0x2`). */
  FP8QUANT_MX_RCEIL = 0,
  /** The OCP MX specification's: `exponent(amax) - exponent(448)`. */
  FP8QUANT_MX_FLOOR = 1,
} fp8quant_mx_recipe_t;

/**
 * @brief Bytes of the scale buffer of `batch` matrices of `m` rows of `num_groups` groups in
 *        `scale_layout`.
 *
 * A size query: no launch limit applies (a buffer for fp8quant_rms_norm_mxfp8() may exceed the
 * quantizer's), only sizes past 64 bits are refused.
 *
 * @param scale_layout  The layout.
 * @param batch         Batches, >= 0.
 * @param m             Rows per batch, >= 0.
 * @param num_groups    Groups per row (`k / 32` for MXFP8, `k / 16` for NVFP4), in [1, 2^62).
 * @param bytes         Output: the buffer's size in bytes.
 */
FP8QUANT_API fp8quant_status_t fp8quant_mx_scale_bytes(fp8quant_mx_scale_layout_t scale_layout, int64_t batch,
                                                       int64_t m, int64_t num_groups, int64_t* bytes);

/**
 * @brief Quantize `x [batch, m, k]` to MXFP8: `q` float8_e4m3fn like x, and one E8M0 byte per
 *        group of 32 in `scale`.
 *
 * Work is enqueued on `stream` of the current device; pointers must be device memory of that
 * device, and `q` and `scale` must not overlap each other or `x`. Arguments are validated first;
 * with `batch == 0` or `m == 0`, nothing is launched. The kernel waits for the previous kernel in
 * the stream before it touches global memory (programmatic dependent launch).
 *
 * @param x               Input, last dimension contiguous.
 * @param x_dtype         Element type of `x`: bfloat16, float16 or float32.
 * @param batch           Batches (experts; 1 for 2-D input), in [0, 65535].
 * @param m               Rows per batch, in [0, 2^31 - 4097].
 * @param k               Elements per row, a positive multiple of 32.
 * @param x_batch_stride  Elements between batches of `x`, >= 0.
 * @param x_row_stride    Elements between rows of `x`, >= 0.
 * @param q               Output float8_e4m3fn values, last dimension contiguous.
 * @param q_batch_stride  Bytes between batches of `q`; batches must not overlap.
 * @param q_row_stride    Bytes between rows of `q`, >= k.
 * @param scale           Output scale bytes: the whole buffer of fp8quant_mx_scale_bytes(), batches
 *                        one after another, 4-byte aligned.
 * @param scale_layout    Layout of `scale`.
 * @param recipe          Scale recipe.
 * @param stream          CUDA stream to enqueue on.
 *
 * One team per scale slot: at most `2^31 - 4097` slots per batch are launched, padding included
 * (`m * G` row-major, `round_up(m, 128) * round_up(G, 4)` swizzled).
 */
FP8QUANT_API fp8quant_status_t fp8quant_mxfp8_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m,
                                                    int64_t k, int64_t x_batch_stride, int64_t x_row_stride, void* q,
                                                    int64_t q_batch_stride, int64_t q_row_stride, void* scale,
                                                    fp8quant_mx_scale_layout_t scale_layout,
                                                    fp8quant_mx_recipe_t recipe, cudaStream_t stream);

/**
 * @brief Quantize `x [batch, m, k]` to NVFP4: `q` `[batch, m, k / 2]` bytes of two e2m1 codes
 *        (element 2i in the low nibble of byte i), and one e4m3 scale byte per group of 16 in
 *        `scale`, with the float32 encode scale `S` read from `global_scale` on the device.
 *
 * Arguments, rules, limits and launch as for fp8quant_mxfp8_quant(), with `k` a positive multiple
 * of 16, `q_row_stride >= k / 2`, and:
 *
 * @param global_scale            Device float32: `S` of the whole input, or of each batch when
 *                                `global_scale_per_batch` is nonzero (`batch` of them; one per
 *                                expert). 4-byte aligned; must not overlap `q` or `scale`.
 *                                `448 * 6 / amax` is the canonical value.
 * @param global_scale_per_batch  Nonzero: one encode scale per batch.
 */
FP8QUANT_API fp8quant_status_t fp8quant_nvfp4_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m,
                                                    int64_t k, int64_t x_batch_stride, int64_t x_row_stride, void* q,
                                                    int64_t q_batch_stride, int64_t q_row_stride, void* scale,
                                                    fp8quant_mx_scale_layout_t scale_layout, const float* global_scale,
                                                    int global_scale_per_batch, cudaStream_t stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FP8QUANT_MX_H_
