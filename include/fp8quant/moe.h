/**
 * @file moe.h
 * @brief Mixture-of-experts data movement around the grouped GEMMs: the routing metadata of
 *        the expert-grouped layouts, and the combine step (each token's expert outputs, weighted
 *        by the router and summed).
 *
 * Layouts and numerics: docs/contract.md, "MoE". Routing takes slots in flat order
 * `s = t * k + j`; within an expert, rows follow that order, so every output is deterministic.
 * Combine computes `out[t] = sum_j weights[t, j] * y[rows[t, j]]` over `j = 0 .. k-1` in that
 * order, each product and each sum rounded in float32 (no fused multiply-add), rounded once to
 * y's dtype (round to nearest even).
 */
#ifndef FP8QUANT_MOE_H_
#define FP8QUANT_MOE_H_

#include "fp8quant/common.h"
#include "fp8quant/mx.h"
#include "fp8quant/quant.h"

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
 *                        `E * max_m` rows. May be null when `y_rows == 0`.
 * @param y_dtype         Element type of `y` and `out`.
 * @param y_rows          Rows of `y`, >= 0.
 * @param h               Elements per row, > 0 and at most `65535 * 128 * (16 / element size)`
 *                        (blocks of 128 16-byte vectors go on grid.y): 33553920 for float32,
 *                        67107840 for float16 and bfloat16.
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

/** @brief Bits of the routing status word. */
typedef enum fp8quant_routing_status FP8QUANT_ENUM_BASE {
  FP8QUANT_ROUTING_OK = 0,
  FP8QUANT_ROUTING_ROWS_OVERFLOW = 1,  /**< M_sum exceeded `rows`: slots past it got row -1. */
  FP8QUANT_ROUTING_MAX_M_OVERFLOW = 2, /**< An expert got more than `max_m` slots: those got -1. */
} fp8quant_routing_status_t;

/**
 * @brief Routing metadata of `topk_ids [t, k]` for the local experts
 *        `expert_offset .. expert_offset + num_experts - 1`, without a device-to-host read.
 *
 * A slot whose id is negative or outside the local range is dropped. Each expert's rows in the
 * contiguous layout start at a multiple of `align`; `rows` is the caller's bound on their total
 * M_sum. Up to 512 experts, one kernel is enqueued on `stream` below 16384 slots (`t * k`) and
 * two from there (per-chunk counts; the placement, whose blocks wait for each other and launch
 * cooperatively), or three where the GPU cannot hold every block of that placement at once (the
 * occupancy, or the launch's own cudaErrorCooperativeLaunchTooLarge) or `FP8QUANT_COOPERATIVE=0`
 * is set in the environment (read at the first routing; per-chunk counts, their scan, the
 * placement); past 512 experts, two (a count, then the placement). The outputs are the same; any
 * other launch error is returned. The status word
 * also serves the placement's blocks as their meeting count: read it only after the routing, and
 * give routings that may run at once (on different streams) status words of their own. Pointers
 * are device memory of the current device, outputs must not overlap `topk_ids` or each other.
 * Every output is written whole, also for `t == 0`.
 *
 * @param topk_ids       int32 or int64 `[t, k]`, contiguous.
 * @param index_bits     32 or 64: the width of `topk_ids`' elements.
 * @param t              Tokens, >= 0.
 * @param k              Slots per token, in [1, 1024]; `t * k` at most 2^31 - 1024.
 * @param num_experts    Local experts E, in [1, 65535].
 * @param expert_offset  Global id of local expert 0, >= 0.
 * @param align          Row alignment of each expert, in [1, 2^20].
 * @param rows           Rows of `m_indices` and `row_token`, in [0, 2^31 - 1].
 * @param max_m          Rows per expert of the masked layout, in [0, (2^31 - 1) / num_experts]
 *                       (`num_experts * max_m` rows fit in int32); 0: no masked layout.
 * @param counts         Output int32 `[E]`: slots per local expert.
 * @param row_offsets    Output int32 `[E + 1]`: first row of each expert; the last is M_sum.
 * @param m_indices      Output int32 `[rows]`: local expert of each row, -1 on padding rows.
 * @param row_token      Output int32 `[rows]`: source token of each row, -1 on padding rows.
 * @param inv_perm       Output int32 `[t, k]`: row of each slot, -1 where dropped.
 * @param masked_row     Output int32 `[t, k]`: `e * max_m + rank`, -1 where dropped; may be null
 *                       when `max_m == 0`.
 * @param status         Output int32 `[1]`: ::fp8quant_routing_status_t bits (0 when every slot
 *                       found its row).
 * @param stream         CUDA stream to enqueue on.
 */
FP8QUANT_API fp8quant_status_t fp8quant_moe_routing(const void* topk_ids, int index_bits, int64_t t, int64_t k,
                                                    int64_t num_experts, int64_t expert_offset, int64_t align,
                                                    int64_t rows, int64_t max_m, int32_t* counts, int32_t* row_offsets,
                                                    int32_t* m_indices, int32_t* row_token, int32_t* inv_perm,
                                                    int32_t* masked_row, int32_t* status, cudaStream_t stream);

/**
 * @brief Fused SiLU-and-mul + group quantization: `y = silu(gate) * up` of `x [batch, m, 2n]`
 *        (gate the first n elements of a row, up the last n), rounded to x's dtype, quantized
 *        into `q [batch, m, n]` and `scale` exactly as fp8quant_per_token_group_quant() would
 *        quantize `y` (docs/contract.md, "MoE").
 *
 * Without `m_indices` and `masked_m` every row is quantized. With them, rows that hold no token
 * are padding and are not read: their q bytes are not written, and their scales are written as
 * 0 only inside a tile (the rows a grouped GEMM's tiles read); past the tiles nothing is written.
 * Contiguous layout: a row is padding when `m_indices[r] < 0`; every row is in a tile, or with
 * `used_rows` only the rows `r < *used_rows` (M_sum: `row_offsets + experts` of
 * fp8quant_moe_routing()). Masked layout: rows `r >= masked_m[b]` are padding, and rows below
 * `align_up(masked_m[b], align)` are in a tile. Arguments and rules are those of
 * fp8quant_per_token_group_quant() (k is n, in [1, 2^30 - 1]; x's rows hold 2n elements, and x's
 * strides must also put the up half 16 bytes apart for the vectorized path), plus:
 *
 * @param m_indices   int32 `[m]`, or null: the contiguous layout's expert of each row (-1:
 *                    padding). Only with `batch == 1`.
 * @param used_rows   int32 `[1]`, or null: rows at or past `*used_rows` are not touched (only
 *                    with `m_indices`).
 * @param masked_m    int32 `[batch]`, or null: rows in use per batch (the masked layout). Not
 *                    with `m_indices`.
 * @param align       Rows per tile of the masked layout, in [1, 2^20] (128: DeepGEMM's tiles).
 * @param group_size  128: the kernel is built for DeepGEMM's 1 x 128 groups.
 */
FP8QUANT_API fp8quant_status_t fp8quant_silu_mul_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch,
                                                       int64_t m, int64_t n, int64_t x_batch_stride,
                                                       int64_t x_row_stride, const int32_t* m_indices,
                                                       const int32_t* used_rows, const int32_t* masked_m, int64_t align,
                                                       void* q, int64_t q_batch_stride, int64_t q_row_stride,
                                                       void* scale, fp8quant_scale_layout_t scale_layout, int ue8m0,
                                                       int64_t group_size, float eps, cudaStream_t stream);

/**
 * @brief Fused SiLU-and-mul + MXFP8 quantization: `y = silu(gate) * up` of `x [batch, m, 2n]`,
 *        rounded to x's dtype, quantized into `q [batch, m, n]` float8_e4m3fn and its E8M0 scale
 *        bytes exactly as fp8quant_mxfp8_quant() would quantize `y` (docs/contract.md, "MXFP8").
 *
 * Rows, padding and the MoE layouts (`m_indices`, `used_rows`, `masked_m`, `align`) as
 * fp8quant_silu_mul_quant(): padding rows are not read, their q bytes are not written, and their
 * scale bytes are 0 inside a tile and untouched past the tiles (with `m_indices` and
 * `used_rows`, or `masked_m`); the swizzled layout's padding bytes of the rows in a tile are 0.
 * The other arguments are fp8quant_mxfp8_quant()'s, with k = n (in [1, 2^30 - 1]; x's rows hold
 * 2n elements).
 */
FP8QUANT_API fp8quant_status_t fp8quant_silu_mul_mxfp8(const void* x, fp8quant_dtype_t x_dtype, int64_t batch,
                                                       int64_t m, int64_t n, int64_t x_batch_stride,
                                                       int64_t x_row_stride, const int32_t* m_indices,
                                                       const int32_t* used_rows, const int32_t* masked_m, int64_t align,
                                                       void* q, int64_t q_batch_stride, int64_t q_row_stride,
                                                       void* scale, fp8quant_mx_scale_layout_t scale_layout,
                                                       fp8quant_mx_recipe_t recipe, cudaStream_t stream);

/**
 * @brief Fused SiLU-and-mul + NVFP4 quantization: as fp8quant_silu_mul_mxfp8(), into
 *        `q [batch, m, n / 2]` (two e2m1 codes a byte) and e4m3 scale bytes, exactly as
 *        fp8quant_nvfp4_quant() would quantize `y` (docs/contract.md, "NVFP4").
 *
 * @param global_scale   Device float32 encode scales, 4-byte aligned, apart from `q` and `scale`.
 * @param global_scales  How many: 1 (one for every row), `batch` (one per batch: the masked
 *                       layout's experts), or, with `m_indices`, the experts' count (row r takes
 *                       `global_scale[m_indices[r]]`; every expert index must be below it).
 * The other arguments are fp8quant_silu_mul_mxfp8()'s.
 */
FP8QUANT_API fp8quant_status_t fp8quant_silu_mul_nvfp4(
    const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t n, int64_t x_batch_stride,
    int64_t x_row_stride, const int32_t* m_indices, const int32_t* used_rows, const int32_t* masked_m, int64_t align,
    void* q, int64_t q_batch_stride, int64_t q_row_stride, void* scale, fp8quant_mx_scale_layout_t scale_layout,
    const float* global_scale, int64_t global_scales, cudaStream_t stream);

/**
 * @brief Fused MoE dispatch + group quantization: each token of `x [tokens, h]` read once,
 *        quantized per group as fp8quant_per_token_group_quant() does, and stored at the row of
 *        each of its slots in an expert-grouped layout (docs/contract.md, "MoE"). The work grows
 *        with the tokens, not with the layout's bound.
 *
 * Contiguous layout (`row_offsets` given): `q [rows, h]`, slot rows from
 * fp8quant_moe_routing()'s `inv_perm`. Masked layout (`row_offsets` null): `q [experts, max_m,
 * h]`, flat slot rows `e * max_m + rank` from its `masked_row`, scales batched per expert. A
 * row that holds no token is padding: its q bytes are not written; its scales are written as 0
 * inside its expert's tile (contiguous: rows `[row_offsets[e] + counts[e], row_offsets[e + 1])`;
 * masked: rows `[counts[e], align_up(counts[e], align))` of expert e); rows past the tiles
 * (past M_sum) are not touched. Arguments and rules are those of
 * fp8quant_per_token_group_quant() for `q` and `scale`, plus:
 *
 * @param x             Tokens `[tokens, h]`, last dimension contiguous.
 * @param tokens        Rows of `x`, >= 0 (0: nothing is written).
 * @param h             Elements per row, a positive multiple of 128.
 * @param x_row_stride  Elements between rows of `x`.
 * @param slot_rows     int32 `[tokens, k]`: the row of each slot (flat `e * max_m + rank` when
 *                      masked); -1, or a row outside the layout, drops the slot.
 * @param k             Slots per token, in [1, 1024]; `tokens * k` fits in int32.
 * @param counts        int32 `[experts]`: tokens per expert.
 * @param row_offsets   int32 `[experts + 1]`: first row of each expert (contiguous layout), or
 *                      null for the masked layout.
 * @param experts       Experts, in [1, 65535], with `experts * ceil(h / 1024)` at most 2^30 (the
 *                      blocks that zero the tiles' padding scales go on grid.x).
 * @param align         Rows per tile of the masked layout, in [1, 2^20]; the contiguous layout's
 *                      tiles come from `row_offsets`.
 * @param rows          Rows of the contiguous layout (its bound), in [0, 2^31 - 1]; ignored when
 *                      masked.
 * @param max_m         Rows per expert of the masked layout, >= 1 with `experts * max_m` in int32;
 *                      0 for the contiguous layout.
 * @param group_size    128.
 */
FP8QUANT_API fp8quant_status_t fp8quant_moe_dispatch_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t tokens,
                                                           int64_t h, int64_t x_row_stride, const int32_t* slot_rows,
                                                           int64_t k, const int32_t* counts, const int32_t* row_offsets,
                                                           int64_t experts, int64_t align, int64_t rows, int64_t max_m,
                                                           void* q, int64_t q_batch_stride, int64_t q_row_stride,
                                                           void* scale, fp8quant_scale_layout_t scale_layout, int ue8m0,
                                                           int64_t group_size, float eps, cudaStream_t stream);

/**
 * @brief Fused MoE dispatch + NVFP4 quantization with an encode scale per expert: each token of
 *        `x [tokens, h]` read once and its groups' amax reduced once, then encoded with the
 *        encode scale of each of its slots' experts and stored at the slot's row, exactly as
 *        fp8quant_nvfp4_quant() would quantize the token with that expert's scale
 *        (docs/contract.md, "NVFP4", "MoE").
 *
 * Layouts, rows, padding and the routing arguments as fp8quant_moe_dispatch_quant(), with `q`
 * `[rows, h / 2]` or `[experts, max_m, h / 2]` (two e2m1 codes a byte), `scale` the whole MX
 * scale buffer of its destination geometry (fp8quant_mx_scale_bytes(scale_layout, batch, m,
 * h / 16), batch and m those of the layout), `h` a positive multiple of 16 and
 * `experts * ceil(h / 128)` at most 2^30; the swizzled layout's padding bytes of every row
 * written are 0. And:
 *
 * @param m_indices      int32 `[rows]`: the expert of each contiguous row (fp8quant_moe_routing()'s
 *                       `m_indices`); needed (and read) only with one encode scale per expert in
 *                       the contiguous layout, ignored otherwise (masked: a row's expert is its
 *                       batch).
 * @param global_scale   Device float32 encode scales, 4-byte aligned, apart from the outputs.
 * @param global_scales  1 (one for every expert) or `experts` (one each).
 */
FP8QUANT_API fp8quant_status_t fp8quant_moe_dispatch_nvfp4(
    const void* x, fp8quant_dtype_t x_dtype, int64_t tokens, int64_t h, int64_t x_row_stride, const int32_t* slot_rows,
    int64_t k, const int32_t* counts, const int32_t* row_offsets, const int32_t* m_indices, int64_t experts,
    int64_t align, int64_t rows, int64_t max_m, void* q, int64_t q_batch_stride, int64_t q_row_stride, void* scale,
    fp8quant_mx_scale_layout_t scale_layout, const float* global_scale, int64_t global_scales, cudaStream_t stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FP8QUANT_MOE_H_
