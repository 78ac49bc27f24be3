/**
 * @file pack.h
 * @brief Scale layout transforms: fp32 scales from one layout to another, power-of-two scales
 *        packed four UE8M0 bytes to an int32 and back, and DeepGEMM SM100's weight-scale form.
 *
 * Layouts are those of ::fp8quant_scale_layout_t (SPEC.md section 2); `fp8quant_scale_shape()`
 * gives each buffer's size. Every function writes its whole output buffer, padding rows and
 * padding bytes included (as 0), and nothing outside it.
 *
 * UE8M0 byte `e` stands for `2^(e - 127)`. A float32 scale is packable when it is `2^k` for an
 * integer k in [-127, 127] (2^-127 is a float32 subnormal; its byte is 0). Where a function meets
 * a value it cannot convert, it writes the UE8M0 NaN byte `0xFF` (packing) or a float32 NaN
 * (unpacking) in its place and, when `first_invalid` is given, lowers `*first_invalid` to the
 * flat index of that value in the input (`(b * rows + r) * num_groups + g` over the logical
 * `[batch, rows, num_groups]` scales). The caller sets `*first_invalid` to `UINT64_MAX` before
 * the call (`cudaMemsetAsync(p, 0xFF, 8, stream)`) and reads it after: it then holds the
 * smallest such index, or `UINT64_MAX` when every value converted.
 *
 * All work is enqueued on `stream` of the current device; pointers are device memory of that
 * device, 4-byte aligned (`first_invalid` 8-byte aligned), and outputs must not overlap inputs.
 * Arguments are validated first; with `batch == 0` or `m == 0` (`n == 0`) nothing is launched.
 * Kernels wait for the previous kernel in the stream before they touch memory (programmatic
 * dependent launch, see fp8quant_set_pdl()).
 */
#ifndef FP8QUANT_PACK_H_
#define FP8QUANT_PACK_H_

#include "fp8quant/common.h"
#include "fp8quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief Copy fp32 scales `[batch, m, num_groups]` from `src_layout` to `dst_layout`.
 *
 * @param src         Input scales: the whole buffer of `src_layout`.
 * @param src_layout  FP8QUANT_SCALE_ROW, FP8QUANT_SCALE_MN or FP8QUANT_SCALE_MN_TMA.
 * @param dst         Output scales: the whole buffer of `dst_layout`.
 * @param dst_layout  FP8QUANT_SCALE_ROW, FP8QUANT_SCALE_MN or FP8QUANT_SCALE_MN_TMA.
 * @param batch       Number of `[m, num_groups]` blocks, >= 0.
 * @param m           Rows, >= 0.
 * @param num_groups  Scales per row, > 0.
 * @param stream      CUDA stream to enqueue on.
 */
FP8QUANT_API fp8quant_status_t fp8quant_convert_scales(const float* src, fp8quant_scale_layout_t src_layout, float* dst,
                                                       fp8quant_scale_layout_t dst_layout, int64_t batch, int64_t m,
                                                       int64_t num_groups, cudaStream_t stream);

/**
 * @brief Pack power-of-two fp32 scales `[batch, m, num_groups]` into FP8QUANT_SCALE_PACKED_UE8M0:
 *        byte `j` of word `(r, p)` is the UE8M0 byte of group `4p + j`.
 *
 * @param src            Input scales: the whole buffer of `src_layout`.
 * @param src_layout     FP8QUANT_SCALE_ROW, FP8QUANT_SCALE_MN or FP8QUANT_SCALE_MN_TMA.
 * @param dst            Output words: the whole FP8QUANT_SCALE_PACKED_UE8M0 buffer.
 * @param batch          Number of `[m, num_groups]` blocks, >= 0.
 * @param m              Rows, >= 0.
 * @param num_groups     Scales per row, > 0.
 * @param first_invalid  Optional (may be null): lowered to the index of a scale that is not a
 *                       packable power of two (see the file comment).
 * @param stream         CUDA stream to enqueue on.
 */
FP8QUANT_API fp8quant_status_t fp8quant_pack_ue8m0(const float* src, fp8quant_scale_layout_t src_layout, int32_t* dst,
                                                   int64_t batch, int64_t m, int64_t num_groups,
                                                   uint64_t* first_invalid, cudaStream_t stream);

/**
 * @brief The fp32 scales `2^(e - 127)` of FP8QUANT_SCALE_PACKED_UE8M0 words, in `dst_layout`.
 *
 * @param src            Input words: the whole FP8QUANT_SCALE_PACKED_UE8M0 buffer.
 * @param dst            Output scales: the whole buffer of `dst_layout`.
 * @param dst_layout     FP8QUANT_SCALE_ROW, FP8QUANT_SCALE_MN or FP8QUANT_SCALE_MN_TMA.
 * @param batch          Number of `[m, num_groups]` blocks, >= 0.
 * @param m              Rows, >= 0.
 * @param num_groups     Scales per row, > 0 (the packed buffer has `ceil(num_groups / 4)` columns).
 * @param first_invalid  Optional (may be null): lowered to the index of a UE8M0 NaN byte 0xFF.
 * @param stream         CUDA stream to enqueue on.
 */
FP8QUANT_API fp8quant_status_t fp8quant_unpack_ue8m0(const int32_t* src, float* dst, fp8quant_scale_layout_t dst_layout,
                                                     int64_t batch, int64_t m, int64_t num_groups,
                                                     uint64_t* first_invalid, cudaStream_t stream);

/**
 * @brief DeepGEMM SM100's weight scales: power-of-two per-block scales `w_scale`
 *        `[batch, ceil(n / block_n), k_blocks]` (contiguous fp32, as fp8quant_per_block_quant()
 *        writes them) broadcast to rows (row `r` takes block `r / block_n`) and packed:
 *        int32 `[batch, n, ceil(k_blocks / 4)]` in the FP8QUANT_SCALE_PACKED_UE8M0 layout of
 *        `m = n`, `num_groups = k_blocks` (SPEC.md section 3).
 *
 * @param w_scale        Input block scales, contiguous.
 * @param batch          Number of weights (experts), >= 0.
 * @param n              Rows of each weight, >= 0.
 * @param k_blocks       Blocks per row of `w_scale`, > 0.
 * @param block_n        Rows per block, > 0.
 * @param dst            Output words: the whole FP8QUANT_SCALE_PACKED_UE8M0 buffer of `(batch, n, k_blocks)`.
 * @param first_invalid  Optional (may be null): lowered to the flat index in `w_scale` of a
 *                       scale that is not a packable power of two.
 * @param stream         CUDA stream to enqueue on.
 */
FP8QUANT_API fp8quant_status_t fp8quant_sm100_weight_scales(const float* w_scale, int64_t batch, int64_t n,
                                                            int64_t k_blocks, int64_t block_n, int32_t* dst,
                                                            uint64_t* first_invalid, cudaStream_t stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FP8QUANT_PACK_H_
