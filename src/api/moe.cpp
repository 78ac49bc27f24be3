// C API of the MoE kernels: validate every argument, then dispatch on the device's architecture.
// SiLU-and-mul quantizes through the group quantizer's body (FP8) or the block-scaled one (MXFP8,
// NVFP4).
#include "fp8quant/moe.h"

#include <cstdint>
#include <string>

#include "api/block_scaled.hpp"
#include "api/checks.hpp"
#include "api/device.hpp"
#include "api/group_quant.hpp"
#include "common/error.hpp"
#include "kernels/moe_combine.hpp"
#include "kernels/moe_routing.hpp"

namespace {

using namespace fp8quant::api;

constexpr int64_t kMaxSlots = 1024;                              // k: slots per token
constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 1;           // tokens go on grid.x
constexpr int64_t kMaxHidden = (int64_t{1} << 31) - 1 - 65536;   // h is int32 on the device
constexpr int64_t kMaxInt32 = (int64_t{1} << 31) - 1;            // rows and slots are int32 on the device
constexpr int64_t kMaxRoutingSlots = (int64_t{1} << 31) - 1024;  // routing strides past the last slot by < 1024
constexpr int64_t kMaxExperts = 65535;                           // one block each
constexpr int64_t kMaxAlign = int64_t{1} << 20;

// A named device buffer of `bytes` bytes, for the overlap checks.
struct Span {
  const char* name;
  const void* ptr;
  int64_t bytes;
};

// The SiLU-and-mul source of x [batch, m, 2n] shared by silu_mul_quant and its block-scaled
// forms: the checks of its MoE row arguments, then the source the quantizer bodies read (which
// check batch, m and the index arrays' pointers).
fp8quant_status_t silu_source(int64_t batch, int64_t m, int64_t n, const int32_t* m_indices, const int32_t* used_rows,
                              const int32_t* masked_m, int64_t align, GroupSource* source) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(n > 0 && n <= kMaxInt32 / 2, "n",
                     "must be in [1, " + to_string(kMaxInt32 / 2) + "], got " + to_string(n));
  FP8QUANT_CHECK_ARG(m_indices == nullptr || masked_m == nullptr, "masked_m",
                     "give m_indices (contiguous layout) or masked_m (masked layout), not both");
  FP8QUANT_CHECK_ARG(m_indices == nullptr || batch <= 1, "m_indices", "needs batch == 1, got " + to_string(batch));
  FP8QUANT_CHECK_ARG(used_rows == nullptr || m_indices != nullptr, "used_rows",
                     "applies to the contiguous layout (m_indices) only");
  FP8QUANT_CHECK_ARG(align >= 1 && align <= kMaxAlign, "align",
                     "must be in [1, " + to_string(kMaxAlign) + "], got " + to_string(align));
  source->kind = fp8quant::QuantSource::kSiluMul;
  source->k_name = "n";
  source->in_batch = batch;
  source->in_rows = m;
  source->in_cols = 2 * n;
  source->up_offset = n;
  source->row_map = m_indices;
  source->row_counts = masked_m;
  source->used_rows = used_rows;
  source->pad_align = align;
  source->indices[0] = {"m_indices", m_indices, m_indices != nullptr ? m : 0};
  source->indices[1] = {"masked_m", masked_m, masked_m != nullptr ? batch : 0};
  source->indices[2] = {"used_rows", used_rows, used_rows != nullptr ? 1 : 0};
  return FP8QUANT_SUCCESS;
}

// The dispatch source of tokens x [tokens, h] shared by moe_dispatch_quant and
// moe_dispatch_nvfp4: the checks of its routing arguments, then the source the quantizer bodies
// read (which check h, the destination's geometry and the index arrays' pointers).
fp8quant_status_t scatter_source(int64_t tokens, int64_t h, const int32_t* slot_rows, int64_t k, const int32_t* counts,
                                 const int32_t* row_offsets, int64_t experts, int64_t align, int64_t rows,
                                 int64_t max_m, GroupSource* source) {
  using std::to_string;
  const bool masked = row_offsets == nullptr;
  FP8QUANT_CHECK_ARG(tokens >= 0 && tokens <= kMaxInt32, "tokens",
                     "must be in [0, " + to_string(kMaxInt32) + "], got " + to_string(tokens));
  FP8QUANT_CHECK_ARG(k >= 1 && k <= kMaxSlots, "k",
                     "must be in [1, " + to_string(kMaxSlots) + "], got " + to_string(k));
  FP8QUANT_CHECK_ARG(tokens * k <= kMaxInt32, "tokens", "tokens * k must fit in int32, got " + to_string(tokens * k));
  FP8QUANT_CHECK_ARG(experts >= 1 && experts <= kMaxExperts, "experts",
                     "must be in [1, " + to_string(kMaxExperts) + "], got " + to_string(experts));
  FP8QUANT_CHECK_ARG(align >= 1 && align <= kMaxAlign, "align",
                     "must be in [1, " + to_string(kMaxAlign) + "], got " + to_string(align));
  if (masked) {
    FP8QUANT_CHECK_ARG(max_m >= 1 && max_m <= kMaxInt32 / experts, "max_m",
                       "must be in [1, " + to_string(kMaxInt32 / experts) +
                           "] (the masked layout, row_offsets null: experts * max_m rows fit in int32), got " +
                           to_string(max_m));
  } else {
    FP8QUANT_CHECK_ARG(max_m == 0, "max_m",
                       "must be 0 for the contiguous layout (row_offsets given), got " + to_string(max_m));
    FP8QUANT_CHECK_ARG(rows >= 0 && rows <= kMaxInt32, "rows",
                       "must be in [0, " + to_string(kMaxInt32) + "], got " + to_string(rows));
  }
  source->kind = fp8quant::QuantSource::kScatter;
  source->batch_name = "experts";  // the destination: experts x max_m (masked), or 1 x rows
  source->m_name = masked ? "max_m" : "rows";
  source->k_name = "h";
  source->in_batch = 1;
  source->in_rows = tokens;  // none: no slot, no tile, nothing to write (the bodies return)
  source->in_cols = h;
  source->row_map = slot_rows;
  source->row_counts = counts;
  source->row_starts = row_offsets;
  source->pad_align = align;
  source->slots_per_row = k;
  source->experts = experts;
  source->indices[0] = {"slot_rows", slot_rows, tokens * k};
  source->indices[1] = {"counts", counts, experts};
  source->indices[2] = {"row_offsets", row_offsets, masked ? 0 : experts + 1};
  return FP8QUANT_SUCCESS;
}

}  // namespace

extern "C" {

fp8quant_status_t fp8quant_moe_combine(const void* y, fp8quant_dtype_t y_dtype, int64_t y_rows, int64_t h,
                                       int64_t y_row_stride, const int32_t* rows, const float* weights, int64_t t,
                                       int64_t k, void* out, int64_t out_row_stride, cudaStream_t stream) {
  using std::to_string;
  const int64_t elem = dtype_size(y_dtype);

  // Values
  FP8QUANT_CHECK_ARG(elem != 0, "y_dtype",
                     "unsupported dtype " + to_string(y_dtype) + " (FLOAT32, FLOAT16 or BFLOAT16)");
  FP8QUANT_CHECK_ARG(y_rows >= 0, "y_rows", "must be >= 0, got " + to_string(y_rows));
  FP8QUANT_CHECK_ARG(h > 0 && h <= kMaxHidden, "h",
                     "must be in [1, " + to_string(kMaxHidden) + "], got " + to_string(h));
  FP8QUANT_CHECK_ARG(t >= 0 && t <= kMaxTokens, "t",
                     "must be in [0, " + to_string(kMaxTokens) + "], got " + to_string(t));
  FP8QUANT_CHECK_ARG(k >= 1 && k <= kMaxSlots, "k",
                     "must be in [1, " + to_string(kMaxSlots) + "], got " + to_string(k));
  const int64_t vec = 16 / elem;  // elements in 16 bytes; a block covers 128 of those along h
  const int64_t col_blocks = (h + vec * 128 - 1) / (vec * 128);
  FP8QUANT_CHECK_ARG(col_blocks <= 65535, "h",
                     "must be at most " + to_string(65535 * 128 * vec) +
                         " for this dtype (blocks along h go on grid.y), got " + to_string(h));

  // Strides: y read (rows may repeat), out written (rows apart); every call
  Operand ys{"y", "y_row_stride", "y_batch_stride", y, elem, 0, y_row_stride};
  Operand os{"out", "out_row_stride", "out_batch_stride", out, elem, 0, out_row_stride};
  FP8QUANT_RETURN_IF_ERROR(check_input(ys, 1, y_rows, h));
  FP8QUANT_RETURN_IF_ERROR(check_output(os, 1, t, h));
  if (t == 0) return FP8QUANT_SUCCESS;  // empty: nothing to launch

  // Pointers: y (unless it has no rows), rows and weights read, out written apart from them
  FP8QUANT_CHECK_ARG(y != nullptr || y_rows == 0, "y", "must not be null");
  FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(y) % elem == 0, "y",
                     "must be aligned to its element size (" + to_string(elem) + " bytes)");
  FP8QUANT_CHECK_ARG(rows != nullptr && reinterpret_cast<uintptr_t>(rows) % 4 == 0, "rows",
                     "must be a non-null, 4-byte aligned int32 pointer");
  FP8QUANT_CHECK_ARG(weights != nullptr && reinterpret_cast<uintptr_t>(weights) % 4 == 0, "weights",
                     "must be a non-null, 4-byte aligned float pointer");
  FP8QUANT_CHECK_ARG(out != nullptr && reinterpret_cast<uintptr_t>(out) % elem == 0, "out",
                     "must be non-null and aligned to its element size (" + to_string(elem) + " bytes)");
  const int64_t slot_bytes = t * k * 4;  // t and k are bounded: no overflow
  FP8QUANT_RETURN_IF_ERROR(check_apart("out", out, os.bytes, "y", y, ys.bytes));
  FP8QUANT_RETURN_IF_ERROR(check_apart("out", out, os.bytes, "rows", rows, slot_bytes));
  FP8QUANT_RETURN_IF_ERROR(check_apart("out", out, os.bytes, "weights", weights, slot_bytes));

  fp8quant::CombineProblem problem{};
  problem.y = y;
  problem.rows = rows;
  problem.weights = weights;
  problem.out = out;
  problem.y_row_stride = ys.row_stride;
  problem.out_row_stride = os.row_stride;
  problem.y_rows = y_rows;
  problem.t = t;
  problem.k = static_cast<int32_t>(k);
  problem.h = static_cast<int32_t>(h);
  problem.col_blocks = static_cast<int32_t>(col_blocks);
  problem.dtype = y_dtype;
  problem.aligned =
      aligned16(y) && aligned16(out) && h % vec == 0 && ys.row_stride % vec == 0 && os.row_stride % vec == 0;
  problem.pdl = fp8quant::pdl_enabled();

  return fp8quant::launch_for_arch(problem, stream, fp8quant::sm90::moe_combine, fp8quant::sm100::moe_combine);
}

fp8quant_status_t fp8quant_moe_routing(const void* topk_ids, int index_bits, int64_t t, int64_t k, int64_t num_experts,
                                       int64_t expert_offset, int64_t align, int64_t rows, int64_t max_m,
                                       int32_t* counts, int32_t* row_offsets, int32_t* m_indices, int32_t* row_token,
                                       int32_t* inv_perm, int32_t* masked_row, int32_t* status, cudaStream_t stream) {
  using std::to_string;
  // Values
  FP8QUANT_CHECK_ARG(index_bits == 32 || index_bits == 64, "index_bits",
                     "must be 32 or 64, got " + to_string(index_bits));
  FP8QUANT_CHECK_ARG(k >= 1 && k <= kMaxSlots, "k",
                     "must be in [1, " + to_string(kMaxSlots) + "], got " + to_string(k));
  FP8QUANT_CHECK_ARG(t >= 0 && t <= kMaxRoutingSlots / k, "t",
                     "must be in [0, " + to_string(kMaxRoutingSlots / k) +
                         "] (t * k <= 2^31 - 1024 slots, int32 on the device), got " + to_string(t));
  FP8QUANT_CHECK_ARG(num_experts >= 1 && num_experts <= kMaxExperts, "num_experts",
                     "must be in [1, " + to_string(kMaxExperts) + "], got " + to_string(num_experts));
  FP8QUANT_CHECK_ARG(expert_offset >= 0, "expert_offset", "must be >= 0, got " + to_string(expert_offset));
  FP8QUANT_CHECK_ARG(align >= 1 && align <= kMaxAlign, "align",
                     "must be in [1, " + to_string(kMaxAlign) + "], got " + to_string(align));
  FP8QUANT_CHECK_ARG(rows >= 0 && rows <= kMaxInt32, "rows",
                     "must be in [0, " + to_string(kMaxInt32) + "], got " + to_string(rows));
  FP8QUANT_CHECK_ARG(max_m >= 0 && max_m <= kMaxInt32 / num_experts, "max_m",
                     "must be in [0, " + to_string(kMaxInt32 / num_experts) +
                         "] (num_experts * max_m rows fit in int32), got " + to_string(max_m));

  // Buffers: present, aligned, apart
  const int64_t slots = t * k;
  const Span spans[] = {
      {"topk_ids", topk_ids, slots * (index_bits / 8)},
      {"counts", counts, num_experts * 4},
      {"row_offsets", row_offsets, (num_experts + 1) * 4},
      {"m_indices", m_indices, rows * 4},
      {"row_token", row_token, rows * 4},
      {"inv_perm", inv_perm, slots * 4},
      {"masked_row", masked_row, max_m > 0 ? slots * 4 : 0},
      {"status", status, 4},
  };
  for (const Span& b : spans) {
    const bool needed = b.bytes > 0 || b.ptr != nullptr;
    if (!needed) continue;  // an empty buffer (or masked_row without max_m) may be null
    FP8QUANT_CHECK_ARG(b.ptr != nullptr, b.name, "must not be null");
    const int64_t a = b.ptr == topk_ids ? index_bits / 8 : 4;
    FP8QUANT_CHECK_ARG(reinterpret_cast<uintptr_t>(b.ptr) % a == 0, b.name,
                       "must be " + to_string(a) + "-byte aligned");
  }
  FP8QUANT_CHECK_ARG(max_m == 0 || slots == 0 || masked_row != nullptr, "masked_row",
                     "must not be null when max_m > 0");
  for (size_t i = 1; i < sizeof(spans) / sizeof(spans[0]); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (spans[i].bytes > 0 && spans[j].bytes > 0) {
        FP8QUANT_RETURN_IF_ERROR(
            check_apart(spans[i].name, spans[i].ptr, spans[i].bytes, spans[j].name, spans[j].ptr, spans[j].bytes));
      }
    }
  }

  fp8quant::RoutingProblem problem{};
  problem.topk_ids = topk_ids;
  problem.counts = counts;
  problem.row_offsets = row_offsets;
  problem.m_indices = m_indices;
  problem.row_token = row_token;
  problem.inv_perm = inv_perm;
  problem.masked_row = max_m > 0 ? masked_row : nullptr;
  problem.status = status;
  problem.expert_offset = expert_offset;
  problem.slots = static_cast<int32_t>(slots);
  problem.k = static_cast<int32_t>(k);
  problem.experts = static_cast<int32_t>(num_experts);
  problem.align = static_cast<int32_t>(align);
  problem.rows = static_cast<int32_t>(rows);
  problem.max_m = static_cast<int32_t>(max_m);
  problem.int64_ids = index_bits == 64;
  problem.pdl = fp8quant::pdl_enabled();
  problem.cooperative = fp8quant::cooperative_enabled();
  return fp8quant::launch_for_arch_with_sm_count(problem, stream, fp8quant::sm90::moe_routing,
                                                 fp8quant::sm100::moe_routing);
}

fp8quant_status_t fp8quant_silu_mul_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t n,
                                          int64_t x_batch_stride, int64_t x_row_stride, const int32_t* m_indices,
                                          const int32_t* used_rows, const int32_t* masked_m, int64_t align, void* q,
                                          int64_t q_batch_stride, int64_t q_row_stride, void* scale,
                                          fp8quant_scale_layout_t scale_layout, int ue8m0, int64_t group_size,
                                          float eps, cudaStream_t stream) {
  FP8QUANT_CHECK_ARG(group_size == 128, "group_size",
                     "must be 128 for silu_mul_quant, got " + std::to_string(group_size));
  fp8quant::api::GroupSource source;
  FP8QUANT_RETURN_IF_ERROR(silu_source(batch, m, n, m_indices, used_rows, masked_m, align, &source));
  return fp8quant::api::group_quant(x, x_dtype, batch, m, n, x_batch_stride, x_row_stride, q, q_batch_stride,
                                    q_row_stride, scale, scale_layout, ue8m0, group_size, eps, source, stream);
}

fp8quant_status_t fp8quant_silu_mul_mxfp8(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t n,
                                          int64_t x_batch_stride, int64_t x_row_stride, const int32_t* m_indices,
                                          const int32_t* used_rows, const int32_t* masked_m, int64_t align, void* q,
                                          int64_t q_batch_stride, int64_t q_row_stride, void* scale,
                                          fp8quant_mx_scale_layout_t scale_layout, fp8quant_mx_recipe_t recipe,
                                          cudaStream_t stream) {
  FP8QUANT_CHECK_ARG(recipe == FP8QUANT_MX_RCEIL || recipe == FP8QUANT_MX_FLOOR, "recipe",
                     "unknown MX recipe " + std::to_string(recipe));
  fp8quant::api::GroupSource source;
  FP8QUANT_RETURN_IF_ERROR(silu_source(batch, m, n, m_indices, used_rows, masked_m, align, &source));
  const fp8quant::api::BlockScaledOutput out{
      scale_layout,
      recipe == FP8QUANT_MX_FLOOR ? fp8quant::BlockFormat::kMxfp8Floor : fp8quant::BlockFormat::kMxfp8Rceil, nullptr,
      0};
  return fp8quant::api::block_scaled_quant(x, x_dtype, batch, m, n, x_batch_stride, x_row_stride, q, q_batch_stride,
                                           q_row_stride, scale, out, source, stream);
}

fp8quant_status_t fp8quant_silu_mul_nvfp4(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t n,
                                          int64_t x_batch_stride, int64_t x_row_stride, const int32_t* m_indices,
                                          const int32_t* used_rows, const int32_t* masked_m, int64_t align, void* q,
                                          int64_t q_batch_stride, int64_t q_row_stride, void* scale,
                                          fp8quant_mx_scale_layout_t scale_layout, const float* global_scale,
                                          int64_t global_scales, cudaStream_t stream) {
  fp8quant::api::GroupSource source;
  FP8QUANT_RETURN_IF_ERROR(silu_source(batch, m, n, m_indices, used_rows, masked_m, align, &source));
  const fp8quant::api::BlockScaledOutput out{scale_layout, fp8quant::BlockFormat::kNvfp4, global_scale, global_scales};
  return fp8quant::api::block_scaled_quant(x, x_dtype, batch, m, n, x_batch_stride, x_row_stride, q, q_batch_stride,
                                           q_row_stride, scale, out, source, stream);
}

fp8quant_status_t fp8quant_moe_dispatch_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t tokens, int64_t h,
                                              int64_t x_row_stride, const int32_t* slot_rows, int64_t k,
                                              const int32_t* counts, const int32_t* row_offsets, int64_t experts,
                                              int64_t align, int64_t rows, int64_t max_m, void* q,
                                              int64_t q_batch_stride, int64_t q_row_stride, void* scale,
                                              fp8quant_scale_layout_t scale_layout, int ue8m0, int64_t group_size,
                                              float eps, cudaStream_t stream) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(group_size == 128, "group_size",
                     "must be 128 for moe_dispatch_quant, got " + to_string(group_size));
  fp8quant::api::GroupSource source;
  FP8QUANT_RETURN_IF_ERROR(
      scatter_source(tokens, h, slot_rows, k, counts, row_offsets, experts, align, rows, max_m, &source));
  const bool masked = row_offsets == nullptr;
  return fp8quant::api::group_quant(x, x_dtype, masked ? experts : 1, masked ? max_m : rows, h, 0, x_row_stride, q,
                                    q_batch_stride, q_row_stride, scale, scale_layout, ue8m0, group_size, eps, source,
                                    stream);
}

fp8quant_status_t fp8quant_moe_dispatch_nvfp4(const void* x, fp8quant_dtype_t x_dtype, int64_t tokens, int64_t h,
                                              int64_t x_row_stride, const int32_t* slot_rows, int64_t k,
                                              const int32_t* counts, const int32_t* row_offsets,
                                              const int32_t* m_indices, int64_t experts, int64_t align, int64_t rows,
                                              int64_t max_m, void* q, int64_t q_batch_stride, int64_t q_row_stride,
                                              void* scale, fp8quant_mx_scale_layout_t scale_layout,
                                              const float* global_scale, int64_t global_scales, cudaStream_t stream) {
  const bool masked = row_offsets == nullptr;
  fp8quant::api::GroupSource source;
  FP8QUANT_RETURN_IF_ERROR(
      scatter_source(tokens, h, slot_rows, k, counts, row_offsets, experts, align, rows, max_m, &source));
  // m_indices: read (and checked) by the body only with one encode scale per expert, contiguous
  fp8quant::api::BlockScaledOutput out{scale_layout, fp8quant::BlockFormat::kNvfp4, global_scale, global_scales};
  out.row_experts = masked ? nullptr : m_indices;
  return fp8quant::api::block_scaled_quant(x, x_dtype, masked ? experts : 1, masked ? max_m : rows, h, 0, x_row_stride,
                                           q, q_batch_stride, q_row_stride, scale, out, source, stream);
}

}  // extern "C"
