// C API of the block-scaled quantization kernel (MXFP8, NVFP4): validate every argument, then
// dispatch on the device's architecture. The body (block_scaled_quant, api/block_scaled.hpp) also
// serves the SiLU-and-mul ops of fp8quant/moe.h.
#include "fp8quant/mx.h"

#include <cstdint>
#include <limits>
#include <string>

#include "api/block_scaled.hpp"
#include "api/checks.hpp"
#include "api/device.hpp"
#include "common/error.hpp"
#include "kernels/block_scaled_quant.hpp"

namespace {

using namespace fp8quant::api;

constexpr int64_t kMaxBatch = 65535;  // batches go on grid.y
// Scale slots per batch are counted in int32 on the device, with a block of headroom.
constexpr int64_t kMaxUnits = std::numeric_limits<int32_t>::max() - 4096;

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// k (the argument `name`) as a positive multiple of `group` with at most kMaxUnits groups.
fp8quant_status_t check_k(int64_t k, int64_t group, const char* name) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(k > 0 && k % group == 0 && k / group <= kMaxUnits, name,
                     "must be a positive multiple of " + to_string(group) + ", got " + to_string(k));
  return FP8QUANT_SUCCESS;
}

}  // namespace

namespace fp8quant::api {

fp8quant_status_t mx_scale_geometry(fp8quant_mx_scale_layout_t scale_layout, int64_t batch, int64_t m,
                                    int64_t num_groups, const char* batch_name, const char* m_name, int64_t* rows,
                                    int64_t* slots, int64_t* bytes) {
  using std::to_string;
  FP8QUANT_CHECK_ARG(scale_layout == FP8QUANT_MX_SCALE_ROW || scale_layout == FP8QUANT_MX_SCALE_SWIZZLED,
                     "scale_layout", "unknown MX scale layout " + to_string(scale_layout));
  FP8QUANT_CHECK_ARG(batch >= 0, batch_name, "must be >= 0, got " + to_string(batch));
  FP8QUANT_CHECK_ARG(m >= 0, m_name, "must be >= 0, got " + to_string(m));
  constexpr int64_t kLimit = int64_t{1} << 62;  // the padding below cannot overflow
  const bool swizzled = scale_layout == FP8QUANT_MX_SCALE_SWIZZLED;
  int64_t per_batch = 0;
  const bool fits = m < kLimit && num_groups < kLimit &&
                    !__builtin_mul_overflow(swizzled ? align_up(m, 128) : m,
                                            swizzled ? align_up(num_groups, 4) : num_groups, &per_batch);
  FP8QUANT_CHECK_ARG(fits, m_name, "the scales of this many rows and groups overflow 64-bit sizes");
  FP8QUANT_CHECK_ARG(!__builtin_mul_overflow(per_batch, batch, bytes), batch_name,
                     "the scales of this many batches overflow 64-bit sizes");
  *rows = swizzled ? align_up(m, 128) : m;
  *slots = swizzled ? align_up(num_groups, 4) : num_groups;
  return FP8QUANT_SUCCESS;
}

fp8quant_status_t block_scaled_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t k,
                                     int64_t x_batch_stride, int64_t x_row_stride, void* q, int64_t q_batch_stride,
                                     int64_t q_row_stride, void* scale, const BlockScaledOutput& out,
                                     const GroupSource& source, cudaStream_t stream) {
  using std::to_string;
  const bool fp4 = out.format == fp8quant::BlockFormat::kNvfp4;
  const int64_t group = fp4 ? fp8quant::kNvfp4Group : fp8quant::kMxGroup;
  const int64_t elem = dtype_size(x_dtype);
  const bool scatter = source.kind == fp8quant::QuantSource::kScatter;

  // Values
  FP8QUANT_CHECK_ARG(elem != 0, "x_dtype",
                     "unsupported input dtype " + to_string(x_dtype) + " (FLOAT32, FLOAT16 or BFLOAT16)");
  FP8QUANT_RETURN_IF_ERROR(check_k(k, group, source.k_name));
  FP8QUANT_CHECK_ARG(batch >= 0 && batch <= kMaxBatch, source.batch_name,
                     "must be in [0, " + to_string(kMaxBatch) + "], got " + to_string(batch));
  FP8QUANT_CHECK_ARG(m >= 0 && m <= kMaxUnits, source.m_name,
                     "must be in [0, " + to_string(kMaxUnits) + "], got " + to_string(m));
  const int64_t num_groups = k / group, q_cols = fp4 ? k / 2 : k;
  int64_t rows = 0, slots = 0, scale_bytes = 0;
  FP8QUANT_RETURN_IF_ERROR(mx_scale_geometry(out.layout, batch, m, num_groups, source.batch_name, source.m_name, &rows,
                                             &slots, &scale_bytes));
  // One team per scale slot, counted in int32: k is what overflows when one row block already needs too many
  const int64_t row_block = out.layout == FP8QUANT_MX_SCALE_SWIZZLED ? 128 : 1;
  FP8QUANT_CHECK_ARG(rows * slots <= kMaxUnits, row_block * slots > kMaxUnits ? source.k_name : source.m_name,
                     "one batch needs " + to_string(rows * slots) + " scale slots (" + to_string(rows) + " rows of " +
                         to_string(slots) + ", padding included), more than the limit of " + to_string(kMaxUnits));
  FP8QUANT_RETURN_IF_ERROR(check_scatter_padding(source, align_up(num_groups, 4)));
  int64_t global_scales = 0;  // encode scales read (NVFP4)
  if (fp4) {
    global_scales = out.global_scales;
    using std::string;
    if (scatter) {  // one for all, or one per expert
      FP8QUANT_CHECK_ARG(global_scales == 1 || global_scales == source.experts, "global_scales",
                         "must be 1 or experts (" + to_string(source.experts) + "), got " + to_string(global_scales));
    } else {  // one for all, one per batch, or (SiLU with m_indices) one per expert
      const bool by_expert = source.row_map != nullptr && global_scales > 1 && global_scales <= kMaxUnits;
      FP8QUANT_CHECK_ARG(global_scales == 1 || global_scales == batch || by_expert, "global_scales",
                         "must be 1 or batch (" + to_string(batch) + ")" +
                             string(source.kind == fp8quant::QuantSource::kSiluMul
                                        ? ", or with m_indices the experts' count, at most " + to_string(kMaxUnits)
                                        : "") +
                             ", got " + to_string(global_scales));
    }
  }

  // Strides and spans, every call; then an empty one is done: nothing read, written or launched
  Operand xs{"x", "x_row_stride", "x_batch_stride", x, elem, x_batch_stride, x_row_stride};
  Operand qs{"q", "q_row_stride", "q_batch_stride", q, 1, q_batch_stride, q_row_stride};
  bool empty = false;
  FP8QUANT_RETURN_IF_ERROR(check_source_strides(source, xs, qs, batch, m, k, q_cols, &empty));
  if (empty) return FP8QUANT_SUCCESS;

  // Pointers: present, aligned, outputs sharing no byte with the inputs or with each other (q is
  // checked as k bytes a row, k / 2 for NVFP4's two elements a byte). The dispatch's contiguous
  // layout reads m_indices only for one encode scale per expert.
  FP8QUANT_RETURN_IF_ERROR(check_quantization_pointers(xs, qs, scale, scale_bytes));
  const bool row_experts = scatter && source.row_starts != nullptr && global_scales > 1;
  FP8QUANT_CHECK_ARG(!row_experts || out.row_experts != nullptr, "m_indices",
                     "must be given with one encode scale per expert in the contiguous layout");
  const IndexInput inputs[5] = {source.indices[0],
                                source.indices[1],
                                source.indices[2],
                                {"global_scale", out.global_scale, global_scales},
                                {"m_indices", out.row_experts, row_experts ? batch * m : 0}};
  FP8QUANT_RETURN_IF_ERROR(check_index_inputs(inputs, 5, q, qs.bytes, scale, scale_bytes));

  // Strides that are never stepped over do not constrain the vectorized path
  const int64_t x_vec = 16 / elem, q_vec = fp4 ? 8 : 16;  // elements and bytes a thread moves at once
  fp8quant::BlockScaledProblem problem{};
  set_group_operands(problem, xs, q, qs, batch, m, num_groups, rows, slots);
  problem.scale = static_cast<uint8_t*>(scale);
  problem.scale_batch_stride = rows * slots;
  problem.units = static_cast<int32_t>(rows * slots);
  problem.row_slots = fp8quant::FastDivisor(static_cast<uint32_t>(slots));
  problem.dtype = x_dtype;
  problem.layout = out.layout;
  problem.format = out.format;
  problem.global_scale = out.global_scale;
  problem.global_scales = static_cast<int32_t>(global_scales);
  problem.global_scale_by_row_expert =  // the SiLU source's m_indices; the scatter picks per slot
      global_scales > 1 && source.kind == fp8quant::QuantSource::kSiluMul && source.row_map != nullptr;
  problem.aligned = aligned16(x) && reinterpret_cast<uintptr_t>(q) % q_vec == 0 && xs.row_stride % x_vec == 0 &&
                    xs.batch_stride % x_vec == 0 && source.up_offset % x_vec == 0 && qs.row_stride % q_vec == 0 &&
                    qs.batch_stride % q_vec == 0;
  problem.pdl = fp8quant::pdl_enabled();
  copy_source(problem, source);
  if (scatter) {
    // Teams walk the tokens; q and the scales keep the destination's geometry
    FP8QUANT_RETURN_IF_ERROR(walk_tokens(problem, source, batch, m, rows, source.in_rows * slots, kMaxUnits));
    problem.row_experts = row_experts ? out.row_experts : nullptr;
  }
  return fp8quant::launch_for_arch_with_sm_count(problem, stream, fp8quant::sm90::block_scaled_quant,
                                                 fp8quant::sm100::block_scaled_quant);
}

}  // namespace fp8quant::api

extern "C" {

fp8quant_status_t fp8quant_mx_scale_bytes(fp8quant_mx_scale_layout_t scale_layout, int64_t batch, int64_t m,
                                          int64_t num_groups, int64_t* bytes) {
  // A size query: no launch limit, only sizes past 64 bits are refused
  FP8QUANT_CHECK_ARG(bytes != nullptr, "bytes", "must not be null");
  FP8QUANT_CHECK_ARG(num_groups > 0 && num_groups < int64_t{1} << 62, "num_groups",
                     "must be in [1, 2^62), got " + std::to_string(num_groups));
  int64_t rows = 0, slots = 0;
  return mx_scale_geometry(scale_layout, batch, m, num_groups, "batch", "m", &rows, &slots, bytes);
}

fp8quant_status_t fp8quant_mxfp8_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t k,
                                       int64_t x_batch_stride, int64_t x_row_stride, void* q, int64_t q_batch_stride,
                                       int64_t q_row_stride, void* scale, fp8quant_mx_scale_layout_t scale_layout,
                                       fp8quant_mx_recipe_t recipe, cudaStream_t stream) {
  FP8QUANT_CHECK_ARG(recipe == FP8QUANT_MX_RCEIL || recipe == FP8QUANT_MX_FLOOR, "recipe",
                     "unknown MX recipe " + std::to_string(recipe));
  const auto format =
      recipe == FP8QUANT_MX_FLOOR ? fp8quant::BlockFormat::kMxfp8Floor : fp8quant::BlockFormat::kMxfp8Rceil;
  return block_scaled_quant(x, x_dtype, batch, m, k, x_batch_stride, x_row_stride, q, q_batch_stride, q_row_stride,
                            scale, BlockScaledOutput{scale_layout, format, nullptr, 0}, GroupSource{}, stream);
}

fp8quant_status_t fp8quant_nvfp4_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t batch, int64_t m, int64_t k,
                                       int64_t x_batch_stride, int64_t x_row_stride, void* q, int64_t q_batch_stride,
                                       int64_t q_row_stride, void* scale, fp8quant_mx_scale_layout_t scale_layout,
                                       const float* global_scale, int global_scale_per_batch, cudaStream_t stream) {
  const BlockScaledOutput out{scale_layout, fp8quant::BlockFormat::kNvfp4, global_scale,
                              global_scale_per_batch != 0 ? batch : 1};
  return block_scaled_quant(x, x_dtype, batch, m, k, x_batch_stride, x_row_stride, q, q_batch_stride, q_row_stride,
                            scale, out, GroupSource{}, stream);
}

}  // extern "C"
