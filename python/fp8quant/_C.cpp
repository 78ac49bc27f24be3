// fp8quant._C: the C API for Python. The torch wrapper passes device addresses and strides (an
// int each, the cheapest crossing); per_token_group_quant takes DLPack tensors of any framework
// without a copy (.noconvert()), checks their shapes, dtypes and devices and hands the rest to
// the C API, which judges every value.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "fp8quant/fp8quant.h"

namespace nb = nanobind;

namespace {

using Tensor = nb::ndarray<>;
using nb::dlpack::dtype_code;

// Raise the Python exception matching a failed status.
void throw_status(fp8quant_status_t status) {
  const std::string msg = fp8quant_last_error();
  if (status == FP8QUANT_ERROR_INVALID_ARGUMENT) throw nb::value_error(msg.c_str());
  throw std::runtime_error(std::string(fp8quant_status_string(status)) + ": " + msg);
}

[[noreturn]] void bad_arg(const std::string& msg) { throw nb::value_error(msg.c_str()); }

bool is_dtype(const Tensor& t, dtype_code code, int bits) {
  return t.dtype().code == static_cast<uint8_t>(code) && t.dtype().bits == bits && t.dtype().lanes == 1;
}

void check_cuda(const Tensor& t, const char* name, int device_id) {
  if (t.device_type() != nb::device::cuda::value) bad_arg(std::string(name) + ": must be a CUDA tensor");
  if (t.device_id() != device_id) {
    bad_arg(std::string(name) + ": is on cuda:" + std::to_string(t.device_id()) + ", x on cuda:" +
            std::to_string(device_id));
  }
}

fp8quant_dtype_t input_dtype(const Tensor& x) {
  if (is_dtype(x, dtype_code::Bfloat, 16)) return FP8QUANT_DTYPE_BFLOAT16;
  if (is_dtype(x, dtype_code::Float, 16)) return FP8QUANT_DTYPE_FLOAT16;
  if (is_dtype(x, dtype_code::Float, 32)) return FP8QUANT_DTYPE_FLOAT32;
  bad_arg("x: dtype must be bfloat16, float16 or float32");
}

// The shape and strides of a DLPack tensor as "(a, b) with strides (c, d)".
std::string describe(const Tensor& t) {
  std::string shape, strides;
  for (size_t i = 0; i < t.ndim(); ++i) {
    shape += (i ? ", " : "") + std::to_string(t.shape(i));
    strides += (i ? ", " : "") + std::to_string(t.stride(i));
  }
  return "shape (" + shape + ") with strides (" + strides + ")";
}

// Quantize through pointers and strides: the torch path's per-call entry (no DLPack import per
// tensor). The arguments are fp8quant_per_token_group_quant's, which checks every one of them.
void per_token_group_quant_ptr(uintptr_t x, int x_dtype, int64_t batch, int64_t m, int64_t k,
                               int64_t x_batch_stride, int64_t x_row_stride, uintptr_t q,
                               int64_t q_batch_stride, int64_t q_row_stride, uintptr_t scale, int layout,
                               bool ue8m0, int64_t group_size, float eps, uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_per_token_group_quant(
      reinterpret_cast<const void*>(x), static_cast<fp8quant_dtype_t>(x_dtype), batch, m, k, x_batch_stride,
      x_row_stride, reinterpret_cast<void*>(q), q_batch_stride, q_row_stride, reinterpret_cast<void*>(scale),
      static_cast<fp8quant_scale_layout_t>(layout), ue8m0 ? 1 : 0, group_size, eps,
      reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// Per-block weight quantization through pointers and strides (fp8quant_per_block_quant, which
// checks every argument).
void per_block_quant_ptr(uintptr_t w, int w_dtype, int64_t batch, int64_t n, int64_t k, int64_t w_batch_stride,
                         int64_t w_row_stride, uintptr_t q, int64_t q_batch_stride, int64_t q_row_stride,
                         uintptr_t scale, int64_t block_n, int64_t block_k, bool ue8m0, float eps, uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_per_block_quant(
      reinterpret_cast<const void*>(w), static_cast<fp8quant_dtype_t>(w_dtype), batch, n, k, w_batch_stride,
      w_row_stride, reinterpret_cast<void*>(q), q_batch_stride, q_row_stride, reinterpret_cast<float*>(scale),
      block_n, block_k, ue8m0 ? 1 : 0, eps, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// MXFP8 quantization through pointers and strides (fp8quant_mxfp8_quant, which checks every
// argument); scale_layout and recipe are the C enums' values.
void mxfp8_quant_ptr(uintptr_t x, int x_dtype, int64_t batch, int64_t m, int64_t k, int64_t x_batch_stride,
                     int64_t x_row_stride, uintptr_t q, int64_t q_batch_stride, int64_t q_row_stride, uintptr_t scale,
                     int scale_layout, int recipe, uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_mxfp8_quant(
      reinterpret_cast<const void*>(x), static_cast<fp8quant_dtype_t>(x_dtype), batch, m, k, x_batch_stride,
      x_row_stride, reinterpret_cast<void*>(q), q_batch_stride, q_row_stride, reinterpret_cast<void*>(scale),
      static_cast<fp8quant_mx_scale_layout_t>(scale_layout), static_cast<fp8quant_mx_recipe_t>(recipe),
      reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// NVFP4 quantization through pointers and strides (fp8quant_nvfp4_quant); the encode scale on
// the device (one, or one per batch).
void nvfp4_quant_ptr(uintptr_t x, int x_dtype, int64_t batch, int64_t m, int64_t k, int64_t x_batch_stride,
                     int64_t x_row_stride, uintptr_t q, int64_t q_batch_stride, int64_t q_row_stride, uintptr_t scale,
                     int scale_layout, uintptr_t global_scale, bool per_batch, uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_nvfp4_quant(
      reinterpret_cast<const void*>(x), static_cast<fp8quant_dtype_t>(x_dtype), batch, m, k, x_batch_stride,
      x_row_stride, reinterpret_cast<void*>(q), q_batch_stride, q_row_stride, reinterpret_cast<void*>(scale),
      static_cast<fp8quant_mx_scale_layout_t>(scale_layout), reinterpret_cast<const float*>(global_scale),
      per_batch ? 1 : 0, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// Requantization of an fp8 weight with power-of-two scales (fp8quant_requantize_ue8m0).
void requantize_ue8m0_ptr(uintptr_t w, int64_t batch, int64_t n, int64_t k, int64_t w_batch_stride,
                          int64_t w_row_stride, uintptr_t q, int64_t q_batch_stride, int64_t q_row_stride,
                          uintptr_t w_scale, uintptr_t scale, int64_t block_n, int64_t block_k, float eps,
                          uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_requantize_ue8m0(
      reinterpret_cast<const void*>(w), reinterpret_cast<const float*>(w_scale), batch, n, k, w_batch_stride,
      w_row_stride, reinterpret_cast<void*>(q), q_batch_stride, q_row_stride, reinterpret_cast<float*>(scale),
      block_n, block_k, eps, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// Scale transforms (pack.h) on device addresses: one entry, `op` naming the C function. src and
// dst are whole buffers; the layouts are those of the fp32 side (the packed side's is implied);
// `block_n` is used by "sm100_weight_scales" only, whose `m` is n and `num_groups` k_blocks.
void scale_transform_ptr(const std::string& op, uintptr_t src, int src_layout, uintptr_t dst, int dst_layout,
                         int64_t batch, int64_t m, int64_t num_groups, int64_t block_n, uintptr_t first_invalid,
                         uintptr_t stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  auto* invalid = reinterpret_cast<uint64_t*>(first_invalid);
  fp8quant_status_t status;
  if (op == "convert") {
    status = fp8quant_convert_scales(reinterpret_cast<const float*>(src), static_cast<fp8quant_scale_layout_t>(src_layout),
                                     reinterpret_cast<float*>(dst), static_cast<fp8quant_scale_layout_t>(dst_layout),
                                     batch, m, num_groups, s);
  } else if (op == "pack") {
    status = fp8quant_pack_ue8m0(reinterpret_cast<const float*>(src), static_cast<fp8quant_scale_layout_t>(src_layout),
                                 reinterpret_cast<int32_t*>(dst), batch, m, num_groups, invalid, s);
  } else if (op == "unpack") {
    status = fp8quant_unpack_ue8m0(reinterpret_cast<const int32_t*>(src), reinterpret_cast<float*>(dst),
                                   static_cast<fp8quant_scale_layout_t>(dst_layout), batch, m, num_groups, invalid, s);
  } else if (op == "sm100_weight_scales") {
    status = fp8quant_sm100_weight_scales(reinterpret_cast<const float*>(src), batch, m, num_groups, block_n,
                                          reinterpret_cast<int32_t*>(dst), invalid, s);
  } else {
    bad_arg("op: unknown scale transform '" + op + "'");
  }
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// MoE combine through pointers and strides (fp8quant_moe_combine, which checks every argument).
void moe_combine_ptr(uintptr_t y, int y_dtype, int64_t y_rows, int64_t h, int64_t y_row_stride, uintptr_t rows,
                     uintptr_t weights, int64_t t, int64_t k, uintptr_t out, int64_t out_row_stride,
                     uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_moe_combine(
      reinterpret_cast<const void*>(y), static_cast<fp8quant_dtype_t>(y_dtype), y_rows, h, y_row_stride,
      reinterpret_cast<const int32_t*>(rows), reinterpret_cast<const float*>(weights), t, k,
      reinterpret_cast<void*>(out), out_row_stride, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// MoE routing metadata through device addresses (fp8quant_moe_routing, which checks every argument).
void moe_routing_ptr(uintptr_t topk_ids, int index_bits, int64_t t, int64_t k, int64_t num_experts,
                     int64_t expert_offset, int64_t align, int64_t rows, int64_t max_m, uintptr_t counts,
                     uintptr_t row_offsets, uintptr_t m_indices, uintptr_t row_token, uintptr_t inv_perm,
                     uintptr_t masked_row, uintptr_t status, uintptr_t stream) {
  const auto i32 = [](uintptr_t p) { return reinterpret_cast<int32_t*>(p); };
  const fp8quant_status_t st = fp8quant_moe_routing(
      reinterpret_cast<const void*>(topk_ids), index_bits, t, k, num_experts, expert_offset, align, rows, max_m,
      i32(counts), i32(row_offsets), i32(m_indices), i32(row_token), i32(inv_perm), i32(masked_row), i32(status),
      reinterpret_cast<cudaStream_t>(stream));
  if (st != FP8QUANT_SUCCESS) throw_status(st);
}

// Fused SiLU-and-mul + group quantization through device addresses (fp8quant_silu_mul_quant).
void silu_mul_quant_ptr(uintptr_t x, int x_dtype, int64_t batch, int64_t m, int64_t n, int64_t x_batch_stride,
                        int64_t x_row_stride, uintptr_t q, int64_t q_batch_stride, int64_t q_row_stride,
                        uintptr_t m_indices, uintptr_t used_rows, uintptr_t masked_m, int64_t align, uintptr_t scale,
                        int layout, bool ue8m0, int64_t group_size, float eps, uintptr_t stream) {
  const auto i32 = [](uintptr_t p) { return reinterpret_cast<const int32_t*>(p); };
  const fp8quant_status_t status = fp8quant_silu_mul_quant(
      reinterpret_cast<const void*>(x), static_cast<fp8quant_dtype_t>(x_dtype), batch, m, n, x_batch_stride,
      x_row_stride, i32(m_indices), i32(used_rows), i32(masked_m), align, reinterpret_cast<void*>(q), q_batch_stride,
      q_row_stride, reinterpret_cast<void*>(scale), static_cast<fp8quant_scale_layout_t>(layout), ue8m0 ? 1 : 0,
      group_size, eps, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// Fused SiLU-and-mul + MXFP8 / NVFP4 quantization through device addresses
// (fp8quant_silu_mul_mxfp8, fp8quant_silu_mul_nvfp4).
void silu_mul_mxfp8_ptr(uintptr_t x, int x_dtype, int64_t batch, int64_t m, int64_t n, int64_t x_batch_stride,
                        int64_t x_row_stride, uintptr_t q, int64_t q_batch_stride, int64_t q_row_stride,
                        uintptr_t m_indices, uintptr_t used_rows, uintptr_t masked_m, int64_t align, uintptr_t scale,
                        int scale_layout, int recipe, uintptr_t stream) {
  const auto i32 = [](uintptr_t p) { return reinterpret_cast<const int32_t*>(p); };
  const fp8quant_status_t status = fp8quant_silu_mul_mxfp8(
      reinterpret_cast<const void*>(x), static_cast<fp8quant_dtype_t>(x_dtype), batch, m, n, x_batch_stride,
      x_row_stride, i32(m_indices), i32(used_rows), i32(masked_m), align, reinterpret_cast<void*>(q), q_batch_stride,
      q_row_stride, reinterpret_cast<void*>(scale), static_cast<fp8quant_mx_scale_layout_t>(scale_layout),
      static_cast<fp8quant_mx_recipe_t>(recipe), reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

void silu_mul_nvfp4_ptr(uintptr_t x, int x_dtype, int64_t batch, int64_t m, int64_t n, int64_t x_batch_stride,
                        int64_t x_row_stride, uintptr_t q, int64_t q_batch_stride, int64_t q_row_stride,
                        uintptr_t m_indices, uintptr_t used_rows, uintptr_t masked_m, int64_t align, uintptr_t scale,
                        int scale_layout, uintptr_t global_scale, int64_t global_scales, uintptr_t stream) {
  const auto i32 = [](uintptr_t p) { return reinterpret_cast<const int32_t*>(p); };
  const fp8quant_status_t status = fp8quant_silu_mul_nvfp4(
      reinterpret_cast<const void*>(x), static_cast<fp8quant_dtype_t>(x_dtype), batch, m, n, x_batch_stride,
      x_row_stride, i32(m_indices), i32(used_rows), i32(masked_m), align, reinterpret_cast<void*>(q), q_batch_stride,
      q_row_stride, reinterpret_cast<void*>(scale), static_cast<fp8quant_mx_scale_layout_t>(scale_layout),
      reinterpret_cast<const float*>(global_scale), global_scales, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// Fused MoE dispatch + group quantization through device addresses (fp8quant_moe_dispatch_quant).
void moe_dispatch_quant_ptr(uintptr_t x, int x_dtype, int64_t tokens, int64_t h, int64_t x_row_stride,
                            uintptr_t slot_rows, int64_t k, uintptr_t counts, uintptr_t row_offsets, int64_t experts,
                            int64_t align, int64_t rows, int64_t max_m, uintptr_t q, int64_t q_batch_stride,
                            int64_t q_row_stride, uintptr_t scale, int layout, bool ue8m0, int64_t group_size,
                            float eps, uintptr_t stream) {
  const auto i32 = [](uintptr_t p) { return reinterpret_cast<const int32_t*>(p); };
  const fp8quant_status_t status = fp8quant_moe_dispatch_quant(
      reinterpret_cast<const void*>(x), static_cast<fp8quant_dtype_t>(x_dtype), tokens, h, x_row_stride,
      i32(slot_rows), k, i32(counts), i32(row_offsets), experts, align, rows, max_m, reinterpret_cast<void*>(q),
      q_batch_stride, q_row_stride, reinterpret_cast<void*>(scale), static_cast<fp8quant_scale_layout_t>(layout),
      ue8m0 ? 1 : 0, group_size, eps, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// Fused MoE dispatch + NVFP4 quantization through device addresses (fp8quant_moe_dispatch_nvfp4).
void moe_dispatch_nvfp4_ptr(uintptr_t x, int x_dtype, int64_t tokens, int64_t h, int64_t x_row_stride,
                            uintptr_t slot_rows, int64_t k, uintptr_t counts, uintptr_t row_offsets,
                            uintptr_t m_indices, int64_t experts, int64_t align, int64_t rows, int64_t max_m,
                            uintptr_t q, int64_t q_batch_stride, int64_t q_row_stride, uintptr_t scale,
                            int scale_layout, uintptr_t global_scale, int64_t global_scales, uintptr_t stream) {
  const auto i32 = [](uintptr_t p) { return reinterpret_cast<const int32_t*>(p); };
  const fp8quant_status_t status = fp8quant_moe_dispatch_nvfp4(
      reinterpret_cast<const void*>(x), static_cast<fp8quant_dtype_t>(x_dtype), tokens, h, x_row_stride,
      i32(slot_rows), k, i32(counts), i32(row_offsets), i32(m_indices), experts, align, rows, max_m,
      reinterpret_cast<void*>(q), q_batch_stride, q_row_stride, reinterpret_cast<void*>(scale),
      static_cast<fp8quant_mx_scale_layout_t>(scale_layout), reinterpret_cast<const float*>(global_scale),
      global_scales, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// RMSNorm through device addresses (fp8quant_rms_norm; residual may be 0).
void rms_norm_ptr(uintptr_t x, uintptr_t residual, uintptr_t weight, int dtype, int64_t m, int64_t h,
                  int64_t x_row_stride, int64_t residual_row_stride, float eps, uintptr_t y, int64_t y_row_stride,
                  uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_rms_norm(
      reinterpret_cast<const void*>(x), reinterpret_cast<void*>(residual), reinterpret_cast<const void*>(weight),
      static_cast<fp8quant_dtype_t>(dtype), m, h, x_row_stride, residual_row_stride, eps, reinterpret_cast<void*>(y),
      y_row_stride, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// Fused RMSNorm + group quantization through device addresses (fp8quant_rms_norm_quant).
void rms_norm_quant_ptr(uintptr_t x, uintptr_t residual, uintptr_t weight, int dtype, int64_t m, int64_t h,
                        int64_t x_row_stride, int64_t residual_row_stride, float eps, uintptr_t q,
                        int64_t q_row_stride, uintptr_t scale, int layout, bool ue8m0, int64_t group_size,
                        float quant_eps, uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_rms_norm_quant(
      reinterpret_cast<const void*>(x), reinterpret_cast<void*>(residual), reinterpret_cast<const void*>(weight),
      static_cast<fp8quant_dtype_t>(dtype), m, h, x_row_stride, residual_row_stride, eps, reinterpret_cast<void*>(q),
      q_row_stride, reinterpret_cast<void*>(scale), static_cast<fp8quant_scale_layout_t>(layout), ue8m0 ? 1 : 0,
      group_size, quant_eps, reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// Fused RMSNorm + MXFP8 / NVFP4 quantization through device addresses (fp8quant_rms_norm_mxfp8,
// fp8quant_rms_norm_nvfp4).
void rms_norm_mxfp8_ptr(uintptr_t x, uintptr_t residual, uintptr_t weight, int dtype, int64_t m, int64_t h,
                        int64_t x_row_stride, int64_t residual_row_stride, float eps, uintptr_t q,
                        int64_t q_row_stride, uintptr_t scale, int scale_layout, int recipe, uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_rms_norm_mxfp8(
      reinterpret_cast<const void*>(x), reinterpret_cast<void*>(residual), reinterpret_cast<const void*>(weight),
      static_cast<fp8quant_dtype_t>(dtype), m, h, x_row_stride, residual_row_stride, eps, reinterpret_cast<void*>(q),
      q_row_stride, reinterpret_cast<void*>(scale), static_cast<fp8quant_mx_scale_layout_t>(scale_layout),
      static_cast<fp8quant_mx_recipe_t>(recipe), reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

void rms_norm_nvfp4_ptr(uintptr_t x, uintptr_t residual, uintptr_t weight, int dtype, int64_t m, int64_t h,
                        int64_t x_row_stride, int64_t residual_row_stride, float eps, uintptr_t q,
                        int64_t q_row_stride, uintptr_t scale, int scale_layout, uintptr_t global_scale,
                        uintptr_t stream) {
  const fp8quant_status_t status = fp8quant_rms_norm_nvfp4(
      reinterpret_cast<const void*>(x), reinterpret_cast<void*>(residual), reinterpret_cast<const void*>(weight),
      static_cast<fp8quant_dtype_t>(dtype), m, h, x_row_stride, residual_row_stride, eps, reinterpret_cast<void*>(q),
      q_row_stride, reinterpret_cast<void*>(scale), static_cast<fp8quant_mx_scale_layout_t>(scale_layout),
      reinterpret_cast<const float*>(global_scale), reinterpret_cast<cudaStream_t>(stream));
  if (status != FP8QUANT_SUCCESS) throw_status(status);
}

// The same from DLPack tensors of any framework (CuPy, JAX, ...): q [.., M, K] is the uint8 view
// of the float8_e4m3fn output, with x's shape; scale has the layout's exact shape and strides,
// backed by the whole padded buffer (fp8quant_scale_shape's numel): the kernel writes the padding
// rows past the view's last element. Shapes and dtypes are checked first, then devices.
void per_token_group_quant(Tensor x, Tensor q, Tensor scale, int layout, bool ue8m0,
                           int64_t group_size, float eps, uintptr_t stream) {
  const size_t nd = x.ndim();
  if (nd != 2 && nd != 3) bad_arg("x: must be 2-D [M, K] or 3-D [B, M, K], got " + describe(x));
  const fp8quant_dtype_t dtype = input_dtype(x);
  const int64_t batch = nd == 3 ? x.shape(0) : 1;
  const int64_t m = x.shape(nd - 2), k = x.shape(nd - 1);
  if (m * k > 0 && x.stride(nd - 1) != 1) bad_arg("x: last dimension must be contiguous, got " + describe(x));

  if (!is_dtype(q, dtype_code::UInt, 8)) bad_arg("q: dtype must be uint8 (a view of the float8_e4m3fn output)");
  bool q_shape_ok = q.ndim() == nd;
  for (size_t i = 0; q_shape_ok && i < nd; ++i) q_shape_ok = q.shape(i) == x.shape(i);
  if (!q_shape_ok) bad_arg("q: must have the shape of x " + describe(x) + ", got " + describe(q));
  if (m * k > 0 && q.stride(nd - 1) != 1) bad_arg("q: last dimension must be contiguous, got " + describe(q));

  const bool packed = layout == FP8QUANT_SCALE_PACKED_UE8M0;
  if (packed ? !is_dtype(scale, dtype_code::Int, 32) : !is_dtype(scale, dtype_code::Float, 32)) {
    bad_arg(std::string("scale: dtype must be ") + (packed ? "int32" : "float32") + " for this layout");
  }
  fp8quant_scale_shape_t s{};
  const fp8quant_status_t st = fp8quant_scale_shape(static_cast<fp8quant_scale_layout_t>(layout),
                                                    batch, m, group_size > 0 ? k / group_size : 0, &s);
  if (st != FP8QUANT_SUCCESS) throw_status(st);
  const bool shape_ok = scale.ndim() == nd && scale.shape(nd - 2) == static_cast<size_t>(m) &&
                        scale.shape(nd - 1) == static_cast<size_t>(s.cols) &&
                        (nd == 2 || scale.shape(0) == static_cast<size_t>(batch));
  const bool strides_ok = shape_ok && (m * s.cols == 0 ||
                                       ((m == 1 || scale.stride(nd - 2) == s.row_stride) &&
                                        (s.cols == 1 || scale.stride(nd - 1) == s.col_stride) &&
                                        (nd == 2 || batch == 1 || scale.stride(0) == s.batch_stride)));
  if (!strides_ok) {
    const std::string b = nd == 3 ? std::to_string(batch) + ", " : "";
    const std::string bs = nd == 3 ? std::to_string(s.batch_stride) + ", " : "";
    bad_arg("scale: expected shape (" + b + std::to_string(m) + ", " + std::to_string(s.cols) + ") with strides (" +
            bs + std::to_string(s.row_stride) + ", " + std::to_string(s.col_stride) + ") for this layout, got " +
            describe(scale));
  }

  const int device_id = x.device_id();
  check_cuda(x, "x", device_id);
  check_cuda(q, "q", device_id);
  check_cuda(scale, "scale", device_id);
  per_token_group_quant_ptr(reinterpret_cast<uintptr_t>(x.data()), dtype, batch, m, k, nd == 3 ? x.stride(0) : 0,
                            x.stride(nd - 2), reinterpret_cast<uintptr_t>(q.data()), nd == 3 ? q.stride(0) : 0,
                            q.stride(nd - 2), reinterpret_cast<uintptr_t>(scale.data()), layout, ue8m0,
                            group_size, eps, stream);
}

// (rows, cols, row_stride, col_stride, batch_stride, numel) of a layout.
nb::tuple scale_shape(int layout, int64_t batch, int64_t m, int64_t num_groups) {
  fp8quant_scale_shape_t s{};
  const fp8quant_status_t st =
      fp8quant_scale_shape(static_cast<fp8quant_scale_layout_t>(layout), batch, m, num_groups, &s);
  if (st != FP8QUANT_SUCCESS) throw_status(st);
  return nb::make_tuple(s.rows, s.cols, s.row_stride, s.col_stride, s.batch_stride, s.numel);
}

}  // namespace

NB_MODULE(_C, mod) {
  mod.doc() = "fp8quant C API bindings (DLPack tensors in, CUDA kernels enqueued on a stream)";

  mod.attr("SCALE_ROW") = static_cast<int>(FP8QUANT_SCALE_ROW);
  mod.attr("SCALE_MN") = static_cast<int>(FP8QUANT_SCALE_MN);
  mod.attr("SCALE_MN_TMA") = static_cast<int>(FP8QUANT_SCALE_MN_TMA);
  mod.attr("SCALE_PACKED_UE8M0") = static_cast<int>(FP8QUANT_SCALE_PACKED_UE8M0);

  mod.def("version", &fp8quant_version);
  mod.def("cuda_version", &fp8quant_cuda_version,
          "CUDA toolkit version the library was built with, as CUDART_VERSION (13000 for 13.0)");
  mod.def("scale_shape", &scale_shape, nb::arg("scale_layout"), nb::arg("batch"), nb::arg("m"),
          nb::arg("num_groups"));
  mod.def("set_pdl", [](bool enabled) { return fp8quant_set_pdl(enabled ? 1 : 0) != 0; }, nb::arg("enabled"),
          "Turn programmatic dependent launch on or off for every later launch; returns the previous setting");
  mod.def("pdl_enabled", [] { return fp8quant_pdl_enabled() != 0; });
  mod.def("per_token_group_quant_ptr", &per_token_group_quant_ptr, nb::arg("x"), nb::arg("x_dtype"),
          nb::arg("batch"), nb::arg("m"), nb::arg("k"), nb::arg("x_batch_stride"), nb::arg("x_row_stride"),
          nb::arg("q"), nb::arg("q_batch_stride"), nb::arg("q_row_stride"), nb::arg("scale"), nb::arg("scale_layout"),
          nb::arg("ue8m0"), nb::arg("group_size"), nb::arg("eps"), nb::arg("stream"),
          "fp8quant_per_token_group_quant on device addresses (x, q, scale), strides in elements of x and "
          "bytes of q, and a CUDA stream address. The C API checks every argument; scale must point at the "
          "whole padded buffer of its layout.");
  mod.def("per_block_quant_ptr", &per_block_quant_ptr, nb::arg("w"), nb::arg("w_dtype"), nb::arg("batch"),
          nb::arg("n"), nb::arg("k"), nb::arg("w_batch_stride"), nb::arg("w_row_stride"), nb::arg("q"),
          nb::arg("q_batch_stride"), nb::arg("q_row_stride"), nb::arg("scale"), nb::arg("block_n"),
          nb::arg("block_k"), nb::arg("ue8m0"), nb::arg("eps"), nb::arg("stream"),
          "fp8quant_per_block_quant on device addresses (w, q, contiguous fp32 scale), strides in elements "
          "of w and bytes of q, and a CUDA stream address.");
  mod.def("mxfp8_quant_ptr", &mxfp8_quant_ptr, nb::arg("x"), nb::arg("x_dtype"), nb::arg("batch"), nb::arg("m"),
          nb::arg("k"), nb::arg("x_batch_stride"), nb::arg("x_row_stride"), nb::arg("q"), nb::arg("q_batch_stride"),
          nb::arg("q_row_stride"), nb::arg("scale"), nb::arg("scale_layout"), nb::arg("recipe"), nb::arg("stream"),
          "fp8quant_mxfp8_quant on device addresses (x, q, the whole scale buffer), strides in elements of x "
          "and bytes of q, and a CUDA stream address.");
  mod.def("nvfp4_quant_ptr", &nvfp4_quant_ptr, nb::arg("x"), nb::arg("x_dtype"), nb::arg("batch"), nb::arg("m"),
          nb::arg("k"), nb::arg("x_batch_stride"), nb::arg("x_row_stride"), nb::arg("q"), nb::arg("q_batch_stride"),
          nb::arg("q_row_stride"), nb::arg("scale"), nb::arg("scale_layout"), nb::arg("global_scale"),
          nb::arg("per_batch"), nb::arg("stream"),
          "fp8quant_nvfp4_quant on device addresses (x, q, the whole scale buffer, the float32 encode scales).");
  mod.def("requantize_ue8m0_ptr", &requantize_ue8m0_ptr, nb::arg("w"), nb::arg("batch"), nb::arg("n"),
          nb::arg("k"), nb::arg("w_batch_stride"), nb::arg("w_row_stride"), nb::arg("q"), nb::arg("q_batch_stride"),
          nb::arg("q_row_stride"), nb::arg("w_scale"), nb::arg("scale"), nb::arg("block_n"),
          nb::arg("block_k"), nb::arg("eps"), nb::arg("stream"),
          "fp8quant_requantize_ue8m0 on device addresses (fp8 w, its contiguous fp32 block scales, q, scale).");
  mod.def("scale_transform_ptr", &scale_transform_ptr, nb::arg("op"), nb::arg("src"), nb::arg("src_layout"),
          nb::arg("dst"), nb::arg("dst_layout"), nb::arg("batch"), nb::arg("m"), nb::arg("num_groups"),
          nb::arg("block_n"), nb::arg("first_invalid"), nb::arg("stream"),
          "fp8quant_convert_scales / pack_ue8m0 / unpack_ue8m0 / sm100_weight_scales (op = 'convert', 'pack', "
          "'unpack', 'sm100_weight_scales') on device addresses of whole buffers; first_invalid may be 0.");
  mod.def("moe_combine_ptr", &moe_combine_ptr, nb::arg("y"), nb::arg("y_dtype"), nb::arg("y_rows"), nb::arg("h"),
          nb::arg("y_row_stride"), nb::arg("rows"), nb::arg("weights"), nb::arg("t"), nb::arg("k"), nb::arg("out"),
          nb::arg("out_row_stride"), nb::arg("stream"),
          "fp8quant_moe_combine on device addresses (y, int32 rows, fp32 weights, out), strides in elements.");
  mod.def("moe_routing_ptr", &moe_routing_ptr, nb::arg("topk_ids"), nb::arg("index_bits"), nb::arg("t"), nb::arg("k"),
          nb::arg("num_experts"), nb::arg("expert_offset"), nb::arg("align"), nb::arg("rows"), nb::arg("max_m"),
          nb::arg("counts"), nb::arg("row_offsets"), nb::arg("m_indices"), nb::arg("row_token"), nb::arg("inv_perm"),
          nb::arg("masked_row"), nb::arg("status"), nb::arg("stream"),
          "fp8quant_moe_routing on device addresses (int32 outputs; masked_row may be 0 when max_m is 0).");
  mod.def("silu_mul_quant_ptr", &silu_mul_quant_ptr, nb::arg("x"), nb::arg("x_dtype"), nb::arg("batch"), nb::arg("m"),
          nb::arg("n"), nb::arg("x_batch_stride"), nb::arg("x_row_stride"), nb::arg("q"), nb::arg("q_batch_stride"),
          nb::arg("q_row_stride"), nb::arg("m_indices"), nb::arg("used_rows"), nb::arg("masked_m"), nb::arg("align"),
          nb::arg("scale"), nb::arg("scale_layout"), nb::arg("ue8m0"), nb::arg("group_size"), nb::arg("eps"),
          nb::arg("stream"), "fp8quant_silu_mul_quant on device addresses (m_indices, used_rows and masked_m may be 0).");
  mod.def("moe_dispatch_quant_ptr", &moe_dispatch_quant_ptr, nb::arg("x"), nb::arg("x_dtype"), nb::arg("tokens"),
          nb::arg("h"), nb::arg("x_row_stride"), nb::arg("slot_rows"), nb::arg("k"), nb::arg("counts"),
          nb::arg("row_offsets"), nb::arg("experts"), nb::arg("align"), nb::arg("rows"), nb::arg("max_m"), nb::arg("q"),
          nb::arg("q_batch_stride"), nb::arg("q_row_stride"), nb::arg("scale"), nb::arg("scale_layout"), nb::arg("ue8m0"),
          nb::arg("group_size"), nb::arg("eps"), nb::arg("stream"),
          "fp8quant_moe_dispatch_quant on device addresses (row_offsets 0 for the masked layout).");
  mod.def("silu_mul_mxfp8_ptr", &silu_mul_mxfp8_ptr, nb::arg("x"), nb::arg("x_dtype"), nb::arg("batch"), nb::arg("m"),
          nb::arg("n"), nb::arg("x_batch_stride"), nb::arg("x_row_stride"), nb::arg("q"), nb::arg("q_batch_stride"),
          nb::arg("q_row_stride"), nb::arg("m_indices"), nb::arg("used_rows"), nb::arg("masked_m"), nb::arg("align"),
          nb::arg("scale"), nb::arg("scale_layout"), nb::arg("recipe"), nb::arg("stream"),
          "fp8quant_silu_mul_mxfp8 on device addresses (0 for an absent index array).");
  mod.def("silu_mul_nvfp4_ptr", &silu_mul_nvfp4_ptr, nb::arg("x"), nb::arg("x_dtype"), nb::arg("batch"), nb::arg("m"),
          nb::arg("n"), nb::arg("x_batch_stride"), nb::arg("x_row_stride"), nb::arg("q"), nb::arg("q_batch_stride"),
          nb::arg("q_row_stride"), nb::arg("m_indices"), nb::arg("used_rows"), nb::arg("masked_m"), nb::arg("align"),
          nb::arg("scale"), nb::arg("scale_layout"), nb::arg("global_scale"), nb::arg("global_scales"),
          nb::arg("stream"), "fp8quant_silu_mul_nvfp4 on device addresses (0 for an absent index array).");
  mod.def("rms_norm_mxfp8_ptr", &rms_norm_mxfp8_ptr, nb::arg("x"), nb::arg("residual"), nb::arg("weight"),
          nb::arg("dtype"), nb::arg("m"), nb::arg("h"), nb::arg("x_row_stride"), nb::arg("residual_row_stride"),
          nb::arg("eps"), nb::arg("q"), nb::arg("q_row_stride"), nb::arg("scale"), nb::arg("scale_layout"),
          nb::arg("recipe"), nb::arg("stream"), "fp8quant_rms_norm_mxfp8 on device addresses (residual 0 for none).");
  mod.def("rms_norm_nvfp4_ptr", &rms_norm_nvfp4_ptr, nb::arg("x"), nb::arg("residual"), nb::arg("weight"),
          nb::arg("dtype"), nb::arg("m"), nb::arg("h"), nb::arg("x_row_stride"), nb::arg("residual_row_stride"),
          nb::arg("eps"), nb::arg("q"), nb::arg("q_row_stride"), nb::arg("scale"), nb::arg("scale_layout"),
          nb::arg("global_scale"), nb::arg("stream"),
          "fp8quant_rms_norm_nvfp4 on device addresses (residual 0 for none).");
  mod.def("moe_dispatch_nvfp4_ptr", &moe_dispatch_nvfp4_ptr, nb::arg("x"), nb::arg("x_dtype"), nb::arg("tokens"),
          nb::arg("h"), nb::arg("x_row_stride"), nb::arg("slot_rows"), nb::arg("k"), nb::arg("counts"),
          nb::arg("row_offsets"), nb::arg("m_indices"), nb::arg("experts"), nb::arg("align"), nb::arg("rows"),
          nb::arg("max_m"), nb::arg("q"), nb::arg("q_batch_stride"), nb::arg("q_row_stride"), nb::arg("scale"),
          nb::arg("scale_layout"), nb::arg("global_scale"), nb::arg("global_scales"), nb::arg("stream"),
          "fp8quant_moe_dispatch_nvfp4 on device addresses (0 for row_offsets and m_indices when masked).");
  mod.def("rms_norm_ptr", &rms_norm_ptr, nb::arg("x"), nb::arg("residual"), nb::arg("weight"), nb::arg("dtype"),
          nb::arg("m"), nb::arg("h"), nb::arg("x_row_stride"), nb::arg("residual_row_stride"), nb::arg("eps"),
          nb::arg("y"), nb::arg("y_row_stride"), nb::arg("stream"),
          "fp8quant_rms_norm on device addresses (residual 0 for none), strides in elements.");
  mod.def("rms_norm_quant_ptr", &rms_norm_quant_ptr, nb::arg("x"), nb::arg("residual"), nb::arg("weight"),
          nb::arg("dtype"), nb::arg("m"), nb::arg("h"), nb::arg("x_row_stride"), nb::arg("residual_row_stride"),
          nb::arg("eps"), nb::arg("q"), nb::arg("q_row_stride"), nb::arg("scale"), nb::arg("scale_layout"),
          nb::arg("ue8m0"), nb::arg("group_size"), nb::arg("quant_eps"), nb::arg("stream"),
          "fp8quant_rms_norm_quant on device addresses (residual 0 for none; q's row stride in bytes).");
  mod.def("per_token_group_quant", &per_token_group_quant, nb::arg("x").noconvert(),
          nb::arg("q").noconvert(), nb::arg("scale").noconvert(), nb::arg("scale_layout"),
          nb::arg("ue8m0"), nb::arg("group_size"), nb::arg("eps"), nb::arg("stream"),
          "Quantize x into q (uint8 view of the float8 output) and scale on the CUDA stream "
          "`stream` (an address, 0 for the legacy default stream). scale must be backed by the "
          "whole padded buffer of its layout; fp8quant.per_token_group_quant checks that, this "
          "function does not.");
}
