// The block-scaled C API (fp8quant_mxfp8_quant, fp8quant_nvfp4_quant, fp8quant_mx_scale_bytes, and the fused producers
// fp8quant_silu_mul_mxfp8 / _nvfp4, fp8quant_rms_norm_mxfp8 / _nvfp4, fp8quant_moe_dispatch_nvfp4): every refusal names
// its argument, with cases on both sides of each boundary, empty calls, and the scale buffer's size in both layouts.
// Where a supported GPU is present, one launch of each quantizer against bytes worked out by hand (the full
// comparison with the reference is tests/python/test_mx_gpu.py).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <vector>

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
  expect_invalid_argument(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, -1, 5, 3, &bytes), "batch");
  expect_invalid_argument(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, 1, -1, 3, &bytes), "m");
  // A size query: the quantizer's launch limits (65535 batches, 2^31 - 4097 slots a batch) do not apply
  EXPECT(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, 65536, 4, 4, &bytes) == FP8QUANT_SUCCESS &&
         bytes == 65536 * 16);
  EXPECT(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_SWIZZLED, 1, int64_t{1} << 21, 1024, &bytes) == FP8QUANT_SUCCESS &&
         bytes == int64_t{1} << 31);  // rms_norm_nvfp4's buffer at m = 2^21, h = 16384
  // Only sizes past 64 bits are refused, naming the argument that overflows
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  expect_invalid_argument(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_SWIZZLED, 1, kMax, 1, &bytes), "m", "overflow");
  expect_invalid_argument(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, 1, 4, kMax, &bytes), "num_groups");
  expect_invalid_argument(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, 1, int64_t{1} << 40, int64_t{1} << 40, &bytes),
                          "m", "overflow");
  expect_invalid_argument(fp8quant_mx_scale_bytes(FP8QUANT_MX_SCALE_ROW, int64_t{1} << 40, 1 << 20, 1 << 10, &bytes),
                          "batch", "overflow");
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
  // 128 rows (one swizzled row block) of 2^26 groups: k is what overflows the slots
  c = Call(), c.m = 128, c.k = c.x_row_stride = c.q_row_stride = int64_t{1} << 31;
  expect_invalid(c, "k", "scale slots");
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

// Empty calls (common.h): every value is checked, no pointer; global_scale may be null like the others
void test_empty() {
  Fp4Call c;
  c.x = nullptr, c.q = nullptr, c.scale = nullptr, c.global_scale = nullptr;
  c.batch = 0, c.m = 4, c.k = 64, c.x_row_stride = 64, c.q_row_stride = 32, c.per_batch = 1;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.batch = 1, c.m = 0, c.per_batch = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.k = 88, expect_invalid(c, "k", "multiple of 16");
  c.k = 64, c.layout = static_cast<fp8quant_mx_scale_layout_t>(2), expect_invalid(c, "scale_layout");
  c.layout = FP8QUANT_MX_SCALE_ROW, c.dtype = static_cast<fp8quant_dtype_t>(9), expect_invalid(c, "x_dtype");
  c.dtype = FP8QUANT_DTYPE_BFLOAT16, c.batch = 2, c.x_batch_stride = -1, expect_invalid(c, "x_batch_stride");
  c.x_batch_stride = 0, c.q_batch_stride = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // batches of no rows do not overlap
  Call mx;
  mx.x = nullptr, mx.q = nullptr, mx.scale = nullptr, mx.m = 0;
  EXPECT(mx.run() == FP8QUANT_SUCCESS);
  mx.recipe = static_cast<fp8quant_mx_recipe_t>(7), expect_invalid(mx, "recipe");
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
  const int32_t* misaligned = reinterpret_cast<const int32_t*>(fake_address<const char>(5) + 2);
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
  c = SiluCall(), c.m_indices = misaligned, c.mxfp8 = true, c.q_row_stride = 96,
  expect_invalid(c, "m_indices", "aligned");

  // Empty: nothing read or written, every pointer may be null; the values are still checked
  c = SiluCall(), c.m = 0, c.x = nullptr, c.q = nullptr, c.scale = nullptr, c.global_scale = nullptr;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.m_indices = misaligned;  // not examined either
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.global_scales = 0, expect_invalid(c, "global_scales");
  c.global_scales = 1, c.align = 0, expect_invalid(c, "align");

  // Sizes far out of range are refused by name, without overflowing the host's arithmetic
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  c = SiluCall(), c.mxfp8 = true, c.q_row_stride = 96, c.m = kMax, c.m_indices = index, expect_invalid(c, "m");
  c = SiluCall(), c.mxfp8 = true, c.q_row_stride = 96, c.batch = kMax, c.masked_m = index, expect_invalid(c, "batch");
  c = SiluCall(), c.k = kMax, expect_invalid(c, "n");
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
  const float* global_scale = nullptr;  // null: MXFP8, unless fp4
  bool fp4 = false;
  int64_t h_stride = 0;  // x's and the residual's row stride; 0: h

  fp8quant_status_t run() const {
    const int64_t stride = h_stride != 0 ? h_stride : h;
    if (global_scale == nullptr && !fp4) {
      return fp8quant_rms_norm_mxfp8(x, residual, weight, FP8QUANT_DTYPE_BFLOAT16, m, h, stride, stride, 1e-6f, q,
                                     q_row_stride, scale, layout, FP8QUANT_MX_RCEIL, nullptr);
    }
    return fp8quant_rms_norm_nvfp4(x, residual, weight, FP8QUANT_DTYPE_BFLOAT16, m, h, stride, stride, 1e-6f, q,
                                   q_row_stride, scale, layout, global_scale, nullptr);
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
  c = NormCall(), c.fp4 = true, c.q_row_stride = 32, expect_invalid(c, "global_scale", "must not be null");

  // Empty: every pointer may be null, global_scale included
  c = NormCall(), c.m = 0, c.x = nullptr, c.weight = nullptr, c.q = nullptr, c.scale = nullptr, c.fp4 = true;
  c.q_row_stride = 32;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.h = 24, expect_invalid(c, "h", "multiple of 16");
  c.h = 64, c.fp4 = false, c.q_row_stride = 64;
  EXPECT(c.run() == FP8QUANT_SUCCESS);

  // The norm's block per row has no limit on scale slots: m up to 2^31 - 4, as rms_norm_quant (the
  // swizzled layout's rows, padded to 128, up to 2^31 - 128). Fake buffers 2^40 bytes apart.
  const auto far = [](int i) { return reinterpret_cast<void*>(uintptr_t(i) << 40); };
  NormCall big;
  big.x = far(1), big.weight = far(2), big.q = far(3), big.scale = far(4);
  big.global_scale = static_cast<const float*>(far(5));
  big.m = int64_t{1} << 21, big.h = 16384, big.q_row_stride = 8192, big.layout = FP8QUANT_MX_SCALE_ROW;
  expect_valid_without_gpu(big);  // 2^31 scale slots: more than the quantizer launches
  big.layout = FP8QUANT_MX_SCALE_SWIZZLED, expect_valid_without_gpu(big);
  big.h = 16, big.q_row_stride = 8, big.m = (int64_t{1} << 31) - 128, expect_valid_without_gpu(big);
  big.m = (int64_t{1} << 31) - 127, expect_invalid(big, "m", "swizzled");
  big.layout = FP8QUANT_MX_SCALE_ROW, big.m = (int64_t{1} << 31) - 4, expect_valid_without_gpu(big);
  big.m = (int64_t{1} << 31) - 3, expect_invalid(big, "m");
}

// MoE dispatch into NVFP4: 4 tokens of h = 64, k = 2, 2 experts, the contiguous layout of 256 rows
struct DispatchCall {
  const void* x = kFakeX;
  void* q = kFakeQ;
  void* scale = kFakeScale;
  fp8quant_dtype_t dtype = FP8QUANT_DTYPE_BFLOAT16;
  fp8quant_mx_scale_layout_t layout = FP8QUANT_MX_SCALE_SWIZZLED;
  const int32_t* slot_rows = fake_address<const int32_t>(5);
  const int32_t* counts = fake_address<const int32_t>(6);
  const int32_t* row_offsets = fake_address<const int32_t>(7);
  const int32_t* m_indices = fake_address<const int32_t>(8);
  const float* global_scale = fake_address<const float>(4);
  int64_t tokens = 4, h = 64, k = 2, experts = 2, rows = 256, max_m = 0, global_scales = 2, q_batch_stride = 0;
  int64_t q_row_stride = 0;  // 0: h / 2

  fp8quant_status_t run() const {
    return fp8quant_moe_dispatch_nvfp4(x, dtype, tokens, h, h, slot_rows, k, counts, row_offsets, m_indices, experts,
                                       128, rows, max_m, q, q_batch_stride, q_row_stride != 0 ? q_row_stride : h / 2,
                                       scale, layout, global_scale, global_scales, nullptr);
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
  c = DispatchCall(), c.global_scales = 3, expect_invalid(c, "global_scales", "1 or experts (2), got 3");

  // m_indices is read only with one encode scale per expert in the contiguous layout
  const int32_t* misaligned = reinterpret_cast<const int32_t*>(fake_address<const char>(8) + 2);
  c = DispatchCall(), c.m_indices = misaligned, expect_invalid(c, "m_indices", "aligned");
  c.global_scales = 1, expect_valid_without_gpu(c);  // one scale for all: ignored
  c = DispatchCall(), c.row_offsets = nullptr, c.max_m = 8, c.q_batch_stride = 8 * 32, c.m_indices = misaligned;
  expect_valid_without_gpu(c);  // masked: ignored

  // The destination's sizes are named as the dispatch names them: rows (contiguous), max_m (masked)
  c = DispatchCall(), c.layout = FP8QUANT_MX_SCALE_ROW, c.h = 1024, c.rows = int64_t{1} << 27;
  expect_invalid(c, "rows", "scale slots");  // 2^27 rows of 64 groups
  c = DispatchCall(), c.row_offsets = nullptr, c.h = 1024, c.max_m = int64_t{1} << 26,
  c.q_batch_stride = int64_t{1} << 35;
  expect_invalid(c, "max_m", "scale slots");
  c = DispatchCall(), c.h = std::numeric_limits<int64_t>::max(), c.experts = 65535, c.row_offsets = nullptr;
  c.max_m = 8, c.global_scales = 1, expect_invalid(c, "h");  // refused by name, no overflow on the way
  c = DispatchCall(), c.h = int64_t{1} << 22, c.experts = 65535, c.global_scales = 1;
  expect_invalid(c, "experts", "2^30");  // 65535 experts x ceil(h / 128) = 2^15 padding blocks

  // No token: nothing read or written, every pointer may be null; every value is still checked
  DispatchCall e;
  e.tokens = 0, e.x = nullptr, e.q = nullptr, e.scale = nullptr, e.slot_rows = nullptr, e.counts = nullptr;
  e.m_indices = nullptr, e.global_scale = nullptr;
  EXPECT(e.run() == FP8QUANT_SUCCESS);
  e.row_offsets = nullptr, e.max_m = 8, e.q_batch_stride = 8 * 32;
  EXPECT(e.run() == FP8QUANT_SUCCESS);
  c = e, c.dtype = static_cast<fp8quant_dtype_t>(9), expect_invalid(c, "x_dtype");
  c = e, c.h = -5, expect_invalid(c, "h");
  c = e, c.layout = static_cast<fp8quant_mx_scale_layout_t>(7), expect_invalid(c, "scale_layout");
  c = e, c.global_scales = 99, expect_invalid(c, "global_scales");
  c = e, c.q_row_stride = -1, expect_invalid(c, "q_row_stride");
  c = e, c.q_batch_stride = 0, expect_invalid(c, "q_batch_stride");
  c = e, c.max_m = 0, expect_invalid(c, "max_m");
}

// On a supported GPU, rows whose elements are all equal (docs/contract.md, "MXFP8" and "NVFP4"):
//   MXFP8 (RCEIL), x [2, 32] bf16: row 0 all 1.0: amax / 448 = 2^-9 * 1.14 rounds up to the scale 2^-8,
//     byte 119, and 1.0 * 2^8 = 256 is e4m3 0x78; row 1 all -3.0: 3 / 448 = 2^-8 * 1.71 gives 2^-7, byte
//     120, and -384 is 0xFC. Swizzled: scale (r, 0) at byte 16 r of a 128 x 4 buffer, the rest 0.
//   NVFP4, x [2, 32] bf16 (two groups a row), S = 448 (448 * 6 / amax): row 0 all 6.0: s = e4m3(6 / 6 * 448)
//     = 448 (0x7E), S / s = 1, e2m1(6) = 7: bytes 0x77; row 1 all -1.5: s = e4m3(0.25 * 448) = 112 (0x6E),
//     S / s = 4, e2m1(-6) = 0xF: bytes 0xFF. Row-major scales.
bool test_launch() {
  if (fp8quant_check_device(nullptr, nullptr) != FP8QUANT_SUCCESS) return false;
  const int64_t m = 2, k = 32;
  std::vector<uint16_t> x(m * k);
  for (int64_t i = 0; i < k; ++i) x[i] = bf16(1.0f), x[k + i] = bf16(-3.0f);
  void *dx, *dq, *ds, *dgs;
  cudaMalloc(&dx, x.size() * 2);
  cudaMalloc(&dq, m * k);
  cudaMalloc(&ds, 512);
  cudaMalloc(&dgs, 4);
  cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dq, 0xA5, m * k);
  cudaMemset(ds, 0xA5, 512);
  EXPECT(fp8quant_mxfp8_quant(dx, FP8QUANT_DTYPE_BFLOAT16, 1, m, k, 0, k, dq, 0, k, ds, FP8QUANT_MX_SCALE_SWIZZLED,
                              FP8QUANT_MX_RCEIL, nullptr) == FP8QUANT_SUCCESS);
  EXPECT(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<uint8_t> q(m * k), s(512);
  cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(s.data(), ds, s.size(), cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < k; ++i) EXPECT(q[i] == 0x78 && q[k + i] == 0xFC);
  EXPECT(s[0] == 119 && s[16] == 120);
  int stray = 0;  // padding bytes not written as 0
  for (int i = 0; i < 512; ++i) stray += i != 0 && i != 16 && s[i] != 0;
  EXPECT(stray == 0);

  for (int64_t i = 0; i < k; ++i) x[i] = bf16(6.0f), x[k + i] = bf16(-1.5f);
  const float encode = 448.0f;
  cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dgs, &encode, 4, cudaMemcpyHostToDevice);
  cudaMemset(dq, 0xA5, m * k);
  cudaMemset(ds, 0xA5, 512);
  EXPECT(fp8quant_nvfp4_quant(dx, FP8QUANT_DTYPE_BFLOAT16, 1, m, k, 0, k, dq, 0, k / 2, ds, FP8QUANT_MX_SCALE_ROW,
                              static_cast<const float*>(dgs), 0, nullptr) == FP8QUANT_SUCCESS);
  EXPECT(cudaDeviceSynchronize() == cudaSuccess);
  cudaMemcpy(q.data(), dq, m * k / 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(s.data(), ds, 8, cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < k / 2; ++i) EXPECT(q[i] == 0x77 && q[k / 2 + i] == 0xFF);
  EXPECT(s[0] == 0x7E && s[1] == 0x7E && s[2] == 0x6E && s[3] == 0x6E);
  EXPECT(s[4] == 0xA5);  // nothing past the 2 x 2 row-major scales
  free_all(dx, dq, ds, dgs);
  return true;
}

}  // namespace

int main() {
  test_scale_bytes();
  test_validation();
  test_nvfp4_validation();
  test_empty();
  test_silu_validation();
  test_norm_validation();
  test_dispatch_validation();
  return finish("MX API", test_launch());
}
