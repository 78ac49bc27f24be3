// The block-scaled C API (fp8quant_mxfp8_quant, fp8quant_nvfp4_quant, fp8quant_mx_scale_bytes): every refusal names its
// argument, with cases on both sides of each boundary, and the scale buffer's size in both layouts.
// No launch: the kernel's bytes are checked against the reference in tests/python/test_mx_gpu.py.
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

}  // namespace

int main() {
  test_scale_bytes();
  test_validation();
  test_nvfp4_validation();
  return finish("MX API", false);
}
