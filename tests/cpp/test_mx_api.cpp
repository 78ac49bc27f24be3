// The block-scaled C API (fp8quant_mxfp8_quant, fp8quant_nvfp4_quant, fp8quant_mx_scale_bytes, and the fused producers
// fp8quant_silu_mul_mxfp8 / _nvfp4, fp8quant_rms_norm_mxfp8 / _nvfp4, fp8quant_moe_dispatch_nvfp4): every refusal names
// its argument, with cases on both sides of each boundary, and the scale buffer's size in both layouts. No launch: the
// kernel's bytes are checked against the reference in tests/python/test_mx_gpu.py.
#include <cstdint>

#include "fixture.hpp"
#include "fp8quant/fp8quant.h"

namespace {

// A well-formed MXFP8 call: x [5, 96] bf16 (three groups), swizzled scales
struct Call : QuantArgs {
  fp8quant_mx_scale_layout_t layout = FP8QUANT_MX_SCALE_SWIZZLED;
  fp8quant_mx_recipe_t recipe = FP8QUANT_MX_RCEIL;

  Call() { m = 5, k = 96, x_row_stride = 96, q_row_stride = 96; }

  fp8quant_status_t run() const {
    return fp8quant_mxfp8_quant(x, dtype, batch, m, k, x_batch_stride, x_row_stride, q, q_batch_stride, q_row_stride,
                                scale, layout, recipe, nullptr);
  }
};

void test_scale_bytes() {
  int64_t bytes = -1;
  EXPECT(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, 2, 5, 3, &bytes) == FP8QUANT_SUCCESS && bytes == 2 * 5 * 3);
  EXPECT(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_SWIZZLED, 2, 5, 3, &bytes) == FP8QUANT_SUCCESS &&
         bytes == 2 * 128 * 4);
  EXPECT(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_SWIZZLED, 1, 129, 5, &bytes) == FP8QUANT_SUCCESS &&
         bytes == 256 * 8);
  expect_invalid_argument(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, 1, 5, 0, &bytes), "num_groups");
  expect_invalid_argument(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, 1, 5, 3, nullptr), "bytes");
  expect_invalid_argument(fp8quant_mx_scale_bytes(static_cast<fp8quant_mx_scale_layout_t>(2), 1, 5, 3, &bytes),
                          "scale_layout");
}

void test_validation() {
  Call c;
  expect_valid_without_gpu(c);
  c.dtype = static_cast<fp8quant_dtype_t>(5), expect_invalid(c, "x_dtype");
  c = Call(), c.recipe = static_cast<fp8quant_mx_recipe_t>(2), expect_invalid(c, "recipe");
  c = Call(), c.layout = static_cast<fp8quant_mx_scale_layout_t>(2), expect_invalid(c, "scale_layout");
  c = Call(), c.k = 0, expect_invalid(c, "k");
  c = Call(), c.k = 80, expect_invalid(c, "k", "multiple of 32");
  c = Call(), c.batch = 65536, expect_invalid(c, "batch");
  c = Call(), c.batch = 65535, c.m = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // empty: accepted, nothing launched
  c = Call(), c.m = -1, expect_invalid(c, "m");
  c = Call(), c.m = int64_t{1} << 30, expect_invalid(c, "m", "scale slots");  // 2^30 rows of 4 slots
  c = Call(), c.x = nullptr, expect_invalid(c, "x");
  c = Call(), c.q_row_stride = 95, expect_invalid(c, "q_row_stride", "must not overlap");
  c = Call(), c.q = const_cast<void*>(kFakeX), expect_invalid(c, "q", "overlaps x");
  // The swizzled buffer of 5 rows is 128 x 4 bytes: it ends 512 bytes in
  c = Call(), c.scale = static_cast<char*>(kFakeQ) + 5 * 96 - 4, expect_invalid(c, "scale", "overlaps q");
  c = Call(), c.scale = static_cast<char*>(kFakeQ) + 5 * 96, expect_valid_without_gpu(c);
  c = Call(), c.layout = FP8QUANT_MX_SCALE_ROW, c.recipe = FP8QUANT_MX_FLOOR, expect_valid_without_gpu(c);
}

// NVFP4: k a multiple of 16, q rows of k / 2 bytes, the encode scale on the device
struct Fp4Call : Call {
  const float* global_scale = fake_address<const float>(4);
  int per_batch = 0;

  Fp4Call() { q_row_stride = 48; }

  fp8quant_status_t run() const {
    return fp8quant_nvfp4_quant(x, dtype, batch, m, k, x_batch_stride, x_row_stride, q, q_batch_stride, q_row_stride,
                                scale, layout, global_scale, per_batch, nullptr);
  }
};

void test_nvfp4_validation() {
  Fp4Call c;
  expect_valid_without_gpu(c);
  c.k = 80, c.x_row_stride = 80, c.q_row_stride = 40, expect_valid_without_gpu(c);  // 5 groups of 16
  c = Fp4Call(), c.k = 88, expect_invalid(c, "k", "multiple of 16");
  c = Fp4Call(), c.q_row_stride = 47, expect_invalid(c, "q_row_stride", "must not overlap");
  c = Fp4Call(), c.global_scale = nullptr, expect_invalid(c, "global_scale", "must not be null");
  c = Fp4Call(), c.global_scale = reinterpret_cast<const float*>(static_cast<const char*>(kFakeX) + 2),
  expect_invalid(c, "global_scale", "aligned");
  c = Fp4Call(), c.global_scale = static_cast<const float*>(kFakeQ), expect_invalid(c, "q", "overlaps global_scale");
  c = Fp4Call(), c.batch = 3, c.q_batch_stride = 5 * 48, c.per_batch = 1, expect_valid_without_gpu(c);
}

// SiLU-and-mul into NVFP4: x [5, 2 * 96] bf16, q [5, 48], the MoE rows and encode scales
struct SiluCall : Fp4Call {
  const int32_t* m_indices = nullptr;
  const int32_t* used_rows = nullptr;
  const int32_t* masked_m = nullptr;
  int64_t align = 128, global_scales = 1;
  bool mxfp8 = false;

  SiluCall() { x_row_stride = 2 * 96; }

  fp8quant_status_t run() const {
    if (mxfp8) {
      return fp8quant_silu_mul_mxfp8(x, dtype, batch, m, k, x_batch_stride, x_row_stride, m_indices, used_rows,
                                     masked_m, align, q, q_batch_stride, q_row_stride, scale, layout, recipe, nullptr);
    }
    return fp8quant_silu_mul_nvfp4(x, dtype, batch, m, k, x_batch_stride, x_row_stride, m_indices, used_rows, masked_m,
                                   align, q, q_batch_stride, q_row_stride, scale, layout, global_scale, global_scales,
                                   nullptr);
  }
};

void test_silu_validation() {
  const int32_t* index = fake_address<const int32_t>(5);
  SiluCall c;
  expect_valid_without_gpu(c);
  c.mxfp8 = true, c.q_row_stride = 96, expect_valid_without_gpu(c);
  c.k = 80, expect_invalid(c, "n", "multiple of 32");
  c = SiluCall(), c.k = 88, expect_invalid(c, "n", "multiple of 16");
  c = SiluCall(), c.m_indices = index, c.global_scales = 8, expect_valid_without_gpu(c);  // one per expert
  c = SiluCall(), c.global_scales = 8, expect_invalid(c, "global_scales");                // 8 needs m_indices
  c = SiluCall(), c.global_scales = 0, expect_invalid(c, "global_scales");
  c = SiluCall(), c.batch = 3, c.x_batch_stride = 5 * 192, c.q_batch_stride = 5 * 48, c.masked_m = index;
  c.global_scales = 3, expect_valid_without_gpu(c);
  c = SiluCall(), c.m_indices = index, c.masked_m = index, expect_invalid(c, "masked_m", "not both");
  c = SiluCall(), c.used_rows = index, expect_invalid(c, "used_rows", "contiguous layout");
  c = SiluCall(), c.align = 0, expect_invalid(c, "align");
  c = SiluCall(), c.m_indices = static_cast<const int32_t*>(kFakeQ), expect_invalid(c, "q", "overlaps m_indices");
}

// RMSNorm into MXFP8 / NVFP4: x [4, 64] bf16, 16-byte aligned rows
struct NormCall {
  const void* x = kFakeX;
  void* residual = nullptr;
  const void* weight = fake_address<const void>(6);
  void* q = kFakeQ;
  void* scale = kFakeScale;
  int64_t m = 4, h = 64, q_row_stride = 64;
  fp8quant_mx_scale_layout_t layout = FP8QUANT_MX_SCALE_SWIZZLED;
  const float* global_scale = nullptr;  // null: MXFP8

  fp8quant_status_t run() const {
    if (global_scale == nullptr) {
      return fp8quant_rms_norm_mxfp8(x, residual, weight, FP8QUANT_DTYPE_BFLOAT16, m, h, h, h, 1e-6f, q, q_row_stride,
                                     scale, layout, FP8QUANT_MX_RCEIL, nullptr);
    }
    return fp8quant_rms_norm_nvfp4(x, residual, weight, FP8QUANT_DTYPE_BFLOAT16, m, h, h, h, 1e-6f, q, q_row_stride,
                                   scale, layout, global_scale, nullptr);
  }
};

void test_norm_validation() {
  const float* encode = fake_address<const float>(4);
  NormCall c;
  expect_valid_without_gpu(c);
  c.h = 48, expect_invalid(c, "h", "multiple of 32");
  c = NormCall(), c.layout = static_cast<fp8quant_mx_scale_layout_t>(2), expect_invalid(c, "scale_layout");
  c = NormCall(), c.q_row_stride = 32, c.global_scale = encode, expect_valid_without_gpu(c);  // 8-byte rows suffice
  c.h = 16, c.q_row_stride = 8, expect_valid_without_gpu(c);
  c.q_row_stride = 12, expect_invalid(c, "q_row_stride", "8 bytes");
  c = NormCall(), c.q_row_stride = 32, c.global_scale = static_cast<const float*>(kFakeScale);
  expect_invalid(c, "scale", "overlaps global_scale");
  c = NormCall(), c.scale = static_cast<char*>(kFakeQ) + 4 * 64 - 4, expect_invalid(c, "scale", "overlaps q");
}

// MoE dispatch into NVFP4: 4 tokens of h = 64, k = 2, 2 experts, the contiguous layout of 256 rows
struct DispatchCall {
  const int32_t* slot_rows = fake_address<const int32_t>(5);
  const int32_t* counts = fake_address<const int32_t>(6);
  const int32_t* row_offsets = fake_address<const int32_t>(7);
  const int32_t* m_indices = fake_address<const int32_t>(8);
  const float* global_scale = fake_address<const float>(4);
  int64_t tokens = 4, h = 64, k = 2, experts = 2, rows = 256, max_m = 0, global_scales = 2, q_batch_stride = 0;

  fp8quant_status_t run() const {
    return fp8quant_moe_dispatch_nvfp4(kFakeX, FP8QUANT_DTYPE_BFLOAT16, tokens, h, h, slot_rows, k, counts, row_offsets,
                                       m_indices, experts, 128, rows, max_m, kFakeQ, q_batch_stride, h / 2, kFakeScale,
                                       FP8QUANT_MX_SCALE_SWIZZLED, global_scale, global_scales, nullptr);
  }
};

void test_dispatch_validation() {
  DispatchCall c;
  expect_valid_without_gpu(c);
  c.h = 40, expect_invalid(c, "h", "multiple of 16");
  c = DispatchCall(), c.global_scales = 3, expect_invalid(c, "global_scales");
  c = DispatchCall(), c.m_indices = nullptr, expect_invalid(c, "m_indices", "one encode scale per expert");
  c.global_scales = 1, expect_valid_without_gpu(c);  // one scale for all: no m_indices needed
  c = DispatchCall(), c.row_offsets = nullptr, c.m_indices = nullptr, c.max_m = 8, c.q_batch_stride = 8 * 32;
  expect_valid_without_gpu(c);  // masked: a row's expert is its batch
  c = DispatchCall(), c.max_m = 4, expect_invalid(c, "max_m", "contiguous layout");
  c = DispatchCall(), c.tokens = 0, c.slot_rows = nullptr;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // no token: nothing to write
  c = DispatchCall(), c.m_indices = static_cast<const int32_t*>(kFakeScale), expect_invalid(c, "scale", "overlaps");
}

}  // namespace

int main() {
  test_scale_bytes();
  test_validation();
  test_nvfp4_validation();
  test_silu_validation();
  test_norm_validation();
  test_dispatch_validation();
  return finish("MX API", false);
}
