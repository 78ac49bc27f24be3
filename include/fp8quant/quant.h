/**
 * @file quant.h
 * @brief Per-token-group FP8 (e4m3) quantization of activations, with the scales written
 *        straight into the layout a block-scaled GEMM reads.
 *
 * Numerics and layouts follow SPEC.md: for each group of `group_size` consecutive elements
 * along K, `s = max(amax_finite, eps) / 448` (IEEE division), optionally rounded up to a power
 * of two (UE8M0), and `q = saturate_e4m3(x / s)` rounded to nearest even.
 */
#ifndef FP8QUANT_QUANT_H_
#define FP8QUANT_QUANT_H_

#include "fp8quant/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief Where the scales go. `M` is the number of rows, `G = K / group_size` the number of
 *        groups, `Ma = align(M, 4)` and `P = ceil(G / 4)`.
 *
 * | layout                       | dtype | shape    | strides   | elements per batch |
 * |------------------------------|-------|----------|-----------|--------------------|
 * | FP8QUANT_SCALE_ROW           | fp32  | `[M, G]` | `(G, 1)`  | `M * G`            |
 * | FP8QUANT_SCALE_MN            | fp32  | `[M, G]` | `(1, M)`  | `G * M`            |
 * | FP8QUANT_SCALE_MN_TMA        | fp32  | `[M, G]` | `(1, Ma)` | `G * Ma`           |
 * | FP8QUANT_SCALE_PACKED_UE8M0  | int32 | `[M, P]` | `(1, Ma)` | `P * Ma`           |
 *
 * Padding rows `M .. Ma-1` and the bytes of packed groups `G .. 4P-1` are written as 0.
 * Batch `b` of a batched input owns the `b`-th block of "elements per batch" scales.
 */
typedef enum fp8quant_scale_layout FP8QUANT_ENUM_BASE {
  FP8QUANT_SCALE_ROW = 0,          /**< fp32, K-major. */
  FP8QUANT_SCALE_MN = 1,           /**< fp32, column-major (MN-major). */
  FP8QUANT_SCALE_MN_TMA = 2,       /**< fp32, column-major with rows padded to 4 (DeepGEMM SM90). */
  FP8QUANT_SCALE_PACKED_UE8M0 = 3, /**< Four UE8M0 bytes per int32, MN-major, TMA-aligned (DeepGEMM SM100). */
} fp8quant_scale_layout_t;

/** @brief Geometry of one scale tensor, in elements of its dtype (4 bytes for every layout). */
typedef struct fp8quant_scale_shape {
  int64_t rows;         /**< Rows held in memory: `M`, or `Ma` for the TMA-aligned layouts. */
  int64_t cols;         /**< Scale columns: `G`, or `P` for packed_ue8m0. */
  int64_t row_stride;   /**< Stride between rows `m` and `m + 1`. */
  int64_t col_stride;   /**< Stride between columns. */
  int64_t batch_stride; /**< Stride between batches: `rows * cols`. */
  int64_t numel;        /**< Elements to allocate for all batches, padding included. */
} fp8quant_scale_shape_t;

/**
 * @brief Compute the scale geometry of a layout.
 *
 * A size query: no launch limit applies; refused only where the scales (TMA-aligned rows
 * included) would reach 2^56 elements.
 *
 * @param scale_layout Scale layout.
 * @param batch       Number of batches (1 for 2-D input), >= 0.
 * @param m           Rows per batch, >= 0.
 * @param num_groups  Groups per row (`K / group_size`), >= 0.
 * @param[out] shape  Filled on success; must not be null.
 */
FP8QUANT_API fp8quant_status_t fp8quant_scale_shape(fp8quant_scale_layout_t scale_layout, int64_t batch, int64_t m,
                                                    int64_t num_groups, fp8quant_scale_shape_t* shape);

/**
 * @brief Quantize `x [batch, m, k]` to float8_e4m3fn in groups of `group_size` along k.
 *
 * Work is enqueued on `stream` of the current device; pointers must be device memory of that
 * device. `q` and `scale` must not overlap each other or `x`: the byte ranges from each one's
 * first to past its last element are compared. Arguments are validated first (common.h); then,
 * with `batch == 0` or `m == 0`, nothing is launched and no device is needed. A 16-byte-aligned `x`
 * and `q` (pointers and strides) take the vectorized path; other alignments take a slower
 * element-wise path with the same results. Strides of a dimension of size 0 or 1 (`x_row_stride`
 * and `q_row_stride` when `m <= 1`, the batch strides when `batch <= 1`) are never used and may
 * hold any value.
 *
 * The kernel waits for the previous kernel in the stream before it reads or writes global memory
 * (programmatic dependent launch, see fp8quant_set_pdl()).
 *
 * @param x               Input, last dimension contiguous.
 * @param x_dtype         Element type of `x`.
 * @param batch           Number of batches (1 for 2-D input), in [0, 65535].
 * @param m               Rows per batch.
 * @param k               Elements per row; a positive multiple of `group_size`.
 * @param x_batch_stride  Elements between batches of `x`, >= 0 (batches may overlap or repeat).
 * @param x_row_stride    Elements between rows of `x`, >= 0 (rows may overlap or repeat).
 * @param q               Output float8_e4m3fn values, last dimension contiguous.
 * @param q_batch_stride  Bytes between batches of `q`; batches must not overlap.
 * @param q_row_stride    Bytes between rows of `q`, >= k.
 * @param scale           Output scales, 4-byte aligned, `fp8quant_scale_shape(...).numel`
 *                        elements (see ::fp8quant_scale_layout_t).
 * @param scale_layout    Layout (and dtype) of `scale`.
 * @param ue8m0           Nonzero: round scales up to powers of two. Required for
 *                        FP8QUANT_SCALE_PACKED_UE8M0.
 * @param group_size      32, 64 or 128.
 * @param eps             Lower bound of each group's amax; finite and at least the smallest
 *                        normal float32, `FLT_MIN` (1.1754944e-38): below it `eps / 448` rounds
 *                        to 0 and an all-zero group would quantize to NaN.
 * @param stream          CUDA stream to enqueue on.
 *
 * At most `2^31 - 4097` groups per batch are launched, counting rows rounded up to 4 for the
 * MN-major layouts (mn, mn_tma, packed_ue8m0: `align(m, 4) * G`, though mn stores only `m` rows)
 * and, for packed_ue8m0, the padding groups up to `4 * ceil(G / 4)`; `x`, `q` and each span at
 * most `2^63 - 1` bytes.
 */
FP8QUANT_API fp8quant_status_t fp8quant_per_token_group_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch,
                                                              int64_t m, int64_t k, int64_t x_batch_stride,
                                                              int64_t x_row_stride, void* q, int64_t q_batch_stride,
                                                              int64_t q_row_stride, void* scale,
                                                              fp8quant_scale_layout_t scale_layout, int ue8m0,
                                                              int64_t group_size, float eps, cudaStream_t stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FP8QUANT_QUANT_H_
