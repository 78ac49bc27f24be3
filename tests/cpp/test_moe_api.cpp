// The MoE C API (fp8quant_moe_combine): every refusal names its argument; where a supported GPU
// is present, one launch against values written out by hand.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "fp8quant/fp8quant.h"

namespace {

// Addresses far apart, never dereferenced by a refused call (see test_c_api.cpp)
const void* const kY = fake_address<const void>(1);
const int32_t* const kRows = fake_address<const int32_t>(2);
const float* const kWeights = fake_address<const float>(3);
void* const kOut = fake_address<void>(4);
constexpr int64_t kMaxRows32 = (int64_t{1} << 31) - 1;

struct Call {
  const void* y = kY;
  fp8quant_dtype_t dtype = FP8QUANT_DTYPE_BFLOAT16;
  int64_t y_rows = 300, h = 256, y_row_stride = 256;
  const int32_t* rows = kRows;
  const float* weights = kWeights;
  int64_t t = 40, k = 8;
  void* out = kOut;
  int64_t out_row_stride = 256;

  fp8quant_status_t run() const {
    return fp8quant_moe_combine(y, dtype, y_rows, h, y_row_stride, rows, weights, t, k, out, out_row_stride, nullptr);
  }
};

void test_validation() {
  Call c;
  expect_valid_without_gpu(c);
  c.dtype = static_cast<fp8quant_dtype_t>(7), expect_invalid(c, "y_dtype");
  c = Call(), c.h = 0, expect_invalid(c, "h");
  c = Call(), c.k = 0, expect_invalid(c, "k");
  c = Call(), c.k = 1025, expect_invalid(c, "k");
  c = Call(), c.t = -1, expect_invalid(c, "t");
  c = Call(), c.y_rows = -1, expect_invalid(c, "y_rows");
  c = Call(), c.t = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // empty: accepted, nothing launched
  c = Call(), c.y = nullptr, expect_invalid(c, "y", "null");
  c = Call(), c.y = nullptr, c.y_rows = 0, expect_valid_without_gpu(c);  // no expert rows: out is 0
  c = Call(), c.y = static_cast<const char*>(kY) + 1, expect_invalid(c, "y", "aligned");
  c = Call(), c.rows = nullptr, expect_invalid(c, "rows");
  c = Call(), c.weights = reinterpret_cast<const float*>(reinterpret_cast<const char*>(kWeights) + 2),
  expect_invalid(c, "weights");
  c = Call(), c.y_row_stride = -1, expect_invalid(c, "y_row_stride");
  c = Call(), c.y_row_stride = 0, expect_valid_without_gpu(c);  // every row the same: allowed for an input
  c = Call(), c.out_row_stride = 255, expect_invalid(c, "out_row_stride", "must not overlap");
  c = Call(), c.out = const_cast<void*>(kY), expect_invalid(c, "out", "overlaps y");
  c = Call(), c.out = const_cast<int32_t*>(kRows) + 4, expect_invalid(c, "out", "overlaps rows");
  // h's blocks of 128 vectors go on grid.y: at most 65535 * 128 * 4 float32 elements
  c = Call(), c.dtype = FP8QUANT_DTYPE_FLOAT32, c.h = c.y_row_stride = c.out_row_stride = 65535 * 128 * 4;
  c.out = reinterpret_cast<void*>(uintptr_t(1) << 40), expect_valid_without_gpu(c);  // out far from y
  c.h = c.y_row_stride = c.out_row_stride = 65535 * 128 * 4 + 1, expect_invalid(c, "h", "33553920");
  // No token: the values are still checked, the pointers not
  c = Call(), c.t = 0, c.y = nullptr, c.rows = nullptr, c.weights = nullptr, c.out = nullptr;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.dtype = FP8QUANT_DTYPE_FLOAT32, c.h = 1 << 25, expect_invalid(c, "h");
  c = Call(), c.t = 0, c.y_row_stride = -1, expect_invalid(c, "y_row_stride");
}

struct Routing {
  const void* ids = kY;
  int bits = 32;
  int64_t t = 100, k = 8, experts = 16, offset = 0, align = 128, rows = 2848, max_m = 100;
  int32_t* counts = fake_address<int32_t>(5);
  int32_t* offsets = fake_address<int32_t>(6);
  int32_t* m_indices = fake_address<int32_t>(7);
  int32_t* row_token = fake_address<int32_t>(8);
  int32_t* inv_perm = fake_address<int32_t>(9);
  int32_t* masked_row = fake_address<int32_t>(10);
  int32_t* status = fake_address<int32_t>(11);

  fp8quant_status_t run() const {
    return fp8quant_moe_routing(ids, bits, t, k, experts, offset, align, rows, max_m, counts, offsets, m_indices,
                                row_token, inv_perm, masked_row, status, nullptr);
  }
};

void test_routing_validation() {
  const bool gpu = have_gpu();
  Routing r;
  if (!gpu) EXPECT(r.run() == FP8QUANT_ERROR_NO_DEVICE);
  r.bits = 16, expect_invalid(r, "index_bits");
  r = Routing(), r.k = 0, expect_invalid(r, "k");
  r = Routing(), r.t = -1, expect_invalid(r, "t");
  r = Routing(), r.t = int64_t{1} << 29, expect_invalid(r, "t", "2^31 - 1024");
  r = Routing(), r.t = (int64_t{1} << 28) - 127, expect_invalid(r, "t", "got 268435329");  // 8 t > 2^31 - 1024
  r = Routing(), r.experts = 0, expect_invalid(r, "num_experts");
  r = Routing(), r.experts = 65536, expect_invalid(r, "num_experts");
  r = Routing(), r.offset = -1, expect_invalid(r, "expert_offset");
  r = Routing(), r.align = 0, expect_invalid(r, "align");
  r = Routing(), r.rows = -1, expect_invalid(r, "rows");
  r = Routing(), r.max_m = int64_t{1} << 28, expect_invalid(r, "max_m", "fit in int32");
  r = Routing(), r.counts = nullptr, expect_invalid(r, "counts", "null");
  r = Routing(), r.ids = static_cast<const char*>(kY) + 4, r.bits = 64, expect_invalid(r, "topk_ids", "8-byte aligned");
  r = Routing(), r.masked_row = nullptr, expect_invalid(r, "masked_row", "null");
  r = Routing(), r.max_m = 0, r.masked_row = nullptr;
  if (!gpu) EXPECT(r.run() == FP8QUANT_ERROR_NO_DEVICE);  // no masked layout: masked_row may be null
  r = Routing(), r.row_token = r.m_indices + 100, expect_invalid(r, "row_token", "overlaps m_indices");
  r = Routing(), r.status = r.inv_perm + 799, expect_invalid(r, "status", "overlaps inv_perm");
}

void test_silu_validation() {
  const void* x = kY;
  void* q = kOut;
  void* scale = fake_address<void>(12);
  const int32_t* used = fake_address<const int32_t>(13);
  const auto run = [&](int64_t group_size, const int32_t* m_indices, const int32_t* used_rows, const int32_t* masked_m,
                       int64_t batch, int64_t align = 128) {
    return fp8quant_silu_mul_quant(x, FP8QUANT_DTYPE_BFLOAT16, batch, 100, 512, 100 * 1024, 1024, m_indices, used_rows,
                                   masked_m, align, q, 100 * 512, 512, scale, FP8QUANT_SCALE_MN_TMA, 0, group_size,
                                   1e-10f, nullptr);
  };
  const bool gpu = have_gpu();
  if (!gpu) {
    EXPECT(run(128, nullptr, nullptr, nullptr, 1) == FP8QUANT_ERROR_NO_DEVICE);
    EXPECT(run(128, kRows, used, nullptr, 1) == FP8QUANT_ERROR_NO_DEVICE);
    EXPECT(run(128, nullptr, nullptr, kRows, 3, 1) == FP8QUANT_ERROR_NO_DEVICE);
  }
  const auto invalid = [](fp8quant_status_t st, const char* arg) { expect_invalid_argument(st, arg); };
  invalid(run(64, nullptr, nullptr, nullptr, 1), "group_size");
  invalid(run(128, kRows, nullptr, kRows, 1), "masked_m");
  invalid(run(128, kRows, nullptr, nullptr, 2), "m_indices");
  invalid(run(128, nullptr, used, kRows, 2), "used_rows");  // used_rows needs m_indices
  invalid(run(128, nullptr, nullptr, kRows, 2, 0), "align");
  invalid(run(128, reinterpret_cast<const int32_t*>(static_cast<const char*>(kOut) + 8), nullptr, nullptr, 1),
          "q");  // overlaps q
  invalid(run(128, kRows, reinterpret_cast<const int32_t*>(static_cast<const char*>(scale) + 8), nullptr, 1), "scale");
  // k is n here: the refusal names n
  expect_invalid_argument(
      fp8quant_silu_mul_quant(x, FP8QUANT_DTYPE_BFLOAT16, 1, 4, 100, 0, 200, nullptr, nullptr, nullptr, 128, q, 0, 100,
                              scale, FP8QUANT_SCALE_ROW, 0, 128, 1e-10f, nullptr),
      "n", "multiple of group_size");
  // Empty: every pointer may be null (misaligned ones too), the values are still checked
  const auto* misaligned = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(kRows) + 2);
  EXPECT(fp8quant_silu_mul_quant(nullptr, FP8QUANT_DTYPE_BFLOAT16, 1, 0, 512, 0, 1024, misaligned, nullptr, nullptr,
                                 128, nullptr, 0, 512, nullptr, FP8QUANT_SCALE_MN_TMA, 0, 128, 1e-10f,
                                 nullptr) == FP8QUANT_SUCCESS);
  expect_invalid_argument(
      fp8quant_silu_mul_quant(nullptr, FP8QUANT_DTYPE_BFLOAT16, 1, 0, 512, 0, 1024, nullptr, nullptr, nullptr, 128,
                              nullptr, 0, 512, nullptr, FP8QUANT_SCALE_MN_TMA, 0, 128, 0.0f, nullptr),
      "eps");
}

void test_dispatch_validation() {
  void* scale = fake_address<void>(12);
  const int32_t* offsets = fake_address<const int32_t>(13);
  const int32_t* counts = fake_address<const int32_t>(14);
  // 100 tokens, k = 2, 8 experts: contiguous rows 2048 (max_m 0), or masked 8 x 64 (row_offsets null)
  const auto run = [&](int64_t tokens, int64_t group_size, const int32_t* slot_rows, const int32_t* row_counts,
                       const int32_t* row_offsets, int64_t max_m, int64_t k = 2, int64_t align = 128) {
    return fp8quant_moe_dispatch_quant(kY, FP8QUANT_DTYPE_BFLOAT16, tokens, 1024, 1024, slot_rows, k, row_counts,
                                       row_offsets, 8, align, 2048, max_m, kOut, 64 * 1024, 1024, scale,
                                       FP8QUANT_SCALE_MN_TMA, 0, group_size, 1e-10f, nullptr);
  };
  const auto invalid = [](fp8quant_status_t st, const char* arg) { expect_invalid_argument(st, arg); };
  if (!have_gpu()) {
    EXPECT(run(100, 128, kRows, counts, offsets, 0) == FP8QUANT_ERROR_NO_DEVICE);
    EXPECT(run(100, 128, kRows, counts, nullptr, 64) == FP8QUANT_ERROR_NO_DEVICE);
  }
  EXPECT(run(0, 128, kRows, counts, offsets, 0) == FP8QUANT_SUCCESS);  // no tokens: nothing to write
  invalid(run(-1, 128, kRows, counts, offsets, 0), "tokens");
  invalid(run(100, 64, kRows, counts, offsets, 0), "group_size");
  invalid(run(100, 128, kRows, counts, offsets, 0, 0), "k");
  invalid(run(100, 128, kRows, counts, offsets, 0, 1025), "k");
  invalid(run(100, 128, kRows, counts, offsets, 0, 2, 0), "align");
  invalid(run(100, 128, kRows, counts, offsets, 64), "max_m");  // contiguous: max_m must be 0
  invalid(run(100, 128, kRows, counts, nullptr, 0), "max_m");   // masked: max_m >= 1
  invalid(run(100, 128, kRows, nullptr, offsets, 0), "counts");
  invalid(run(100, 128, nullptr, counts, offsets, 0), "slot_rows");
  invalid(run(100, 128, reinterpret_cast<const int32_t*>(static_cast<const char*>(kOut) + 64), counts, offsets, 0),
          "q");

  // Each refusal names the dispatch's own argument: h (the quantizer's k), rows (its m)
  const auto call = [&](int64_t tokens, int64_t h, int64_t rows, int64_t max_m, const int32_t* row_offsets,
                        const void* x, void* q, void* s, const int32_t* slot_rows, const int32_t* row_counts,
                        fp8quant_dtype_t dtype = FP8QUANT_DTYPE_BFLOAT16, int64_t q_row_stride = 0,
                        fp8quant_scale_layout_t layout = FP8QUANT_SCALE_ROW, float eps = 1e-10f) {
    return fp8quant_moe_dispatch_quant(x, dtype, tokens, h, h, slot_rows, 2, row_counts, row_offsets, 8, 128, rows,
                                       max_m, q, max_m * h, q_row_stride != 0 ? q_row_stride : h, s, layout, 0, 128,
                                       eps, nullptr);
  };
  expect_invalid_argument(call(4, 100, 256, 0, offsets, kY, kOut, scale, kRows, counts), "h", "multiple of group_size");
  expect_invalid_argument(call(4, 128, kMaxRows32, 0, offsets, kY, kOut, scale, kRows, counts), "rows", "at most");
  expect_invalid_argument(call(4, 1024, int64_t{1} << 30, 0, offsets, kY, kOut, scale, kRows, counts), "rows",
                          "group slots");  // 2^30 rows of 8 groups
  expect_invalid_argument(call(4, 4096, 0, int64_t{1} << 27, nullptr, kY, kOut, scale, kRows, counts), "max_m",
                          "group slots");  // 2^27 rows of 32 groups an expert

  // No token: nothing read or written, every pointer may be null; the values are still checked
  EXPECT(call(0, 1024, 2048, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, FP8QUANT_DTYPE_BFLOAT16, 0,
              FP8QUANT_SCALE_MN_TMA) == FP8QUANT_ERROR_INVALID_ARGUMENT);  // masked needs max_m
  EXPECT(call(0, 1024, 2048, 64, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr) == FP8QUANT_SUCCESS);
  EXPECT(call(0, 1024, 2048, 0, offsets, nullptr, nullptr, nullptr, nullptr, nullptr) == FP8QUANT_SUCCESS);
  const auto empty = [&](fp8quant_dtype_t dtype, int64_t h, int64_t q_row_stride, fp8quant_scale_layout_t layout,
                         float eps) {
    return call(0, h, 0, 8, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, dtype, q_row_stride, layout, eps);
  };
  const auto bf16_type = FP8QUANT_DTYPE_BFLOAT16;
  const auto row = FP8QUANT_SCALE_ROW;
  expect_invalid_argument(empty(static_cast<fp8quant_dtype_t>(9), 128, 0, row, 1e-10f), "x_dtype");
  expect_invalid_argument(empty(bf16_type, -5, 128, row, 1e-10f), "h");
  expect_invalid_argument(empty(bf16_type, 128, 0, static_cast<fp8quant_scale_layout_t>(7), 1e-10f), "scale_layout");
  expect_invalid_argument(empty(bf16_type, 128, 0, row, -1.0f), "eps");
  expect_invalid_argument(empty(bf16_type, 128, -1, row, 1e-10f), "q_row_stride");
}

// On a supported GPU: y rows of constants 1, 2, 4; token 0 takes 0.5 * row 1 + 0.25 * row 2,
// token 1 takes 3 * row 0 and a dropped slot.
bool test_launch() {
  if (fp8quant_check_device(nullptr, nullptr) != FP8QUANT_SUCCESS) return false;
  const int64_t h = 24;  // three 16-byte vectors of bf16
  std::vector<uint16_t> y(3 * h);
  for (int64_t i = 0; i < 3 * h; ++i) y[i] = bf16(static_cast<float>(1 << (i / h)));
  const int32_t rows[4] = {1, 2, 0, -1};
  const float weights[4] = {0.5f, 0.25f, 3.0f, 100.0f};
  void *dy, *dout;
  int32_t* drows;
  float* dw;
  cudaMalloc(&dy, y.size() * 2);
  cudaMalloc(&dout, 2 * h * 2);
  cudaMalloc(reinterpret_cast<void**>(&drows), sizeof(rows));
  cudaMalloc(reinterpret_cast<void**>(&dw), sizeof(weights));
  cudaMemcpy(dy, y.data(), y.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(drows, rows, sizeof(rows), cudaMemcpyHostToDevice);
  cudaMemcpy(dw, weights, sizeof(weights), cudaMemcpyHostToDevice);
  cudaMemset(dout, 0xA5, 2 * h * 2);
  EXPECT(fp8quant_moe_combine(dy, FP8QUANT_DTYPE_BFLOAT16, 3, h, h, drows, dw, 2, 2, dout, h, nullptr) ==
         FP8QUANT_SUCCESS);
  std::vector<uint16_t> out(2 * h);
  cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost);
  EXPECT(out[0] == bf16(2.0f) && out[h - 1] == bf16(2.0f));  // 0.5 * 2 + 0.25 * 4
  EXPECT(out[h] == bf16(3.0f) && out[2 * h - 1] == bf16(3.0f));
  free_all(dy, dout, drows, dw);
  return true;
}

}  // namespace

int main() {
  test_validation();
  test_routing_validation();
  test_silu_validation();
  test_dispatch_validation();
  return finish("MoE API", test_launch());
}
