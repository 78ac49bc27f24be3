// The weights C API (fp8quant_per_block_quant): every refusal names its argument, with cases on
// both sides of each boundary; where a supported GPU is present, one launch against hand values.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "fp8quant/fp8quant.h"

namespace {

// Addresses far apart, never dereferenced by a refused call (see test_c_api.cpp)
const void* const kW = fake_address<const void>(1);
void* const kQ = fake_address<void>(2);
float* const kScale = fake_address<float>(3);

struct Call {
  const void* w = kW;
  fp8quant_dtype_t dtype = FP8QUANT_DTYPE_BFLOAT16;
  int64_t batch = 1, n = 200, k = 300, w_batch_stride = 0, w_row_stride = 300;
  void* q = kQ;
  int64_t q_batch_stride = 0, q_row_stride = 300;
  float* scale = kScale;
  int64_t block_n = 128, block_k = 128;
  int ue8m0 = 0;
  float eps = 1e-4f;

  fp8quant_status_t run() const {
    return fp8quant_per_block_quant(w, dtype, batch, n, k, w_batch_stride, w_row_stride, q, q_batch_stride,
                                    q_row_stride, scale, block_n, block_k, ue8m0, eps, nullptr);
  }
};

void test_validation() {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Call c;
  expect_valid_without_gpu(c);
  c.dtype = static_cast<fp8quant_dtype_t>(5), expect_invalid(c, "w_dtype");
  c = Call(), c.block_n = 64, expect_invalid(c, "block_n", "must be 128, got 64");
  c = Call(), c.block_k = 256, expect_invalid(c, "block_k", "must be 128, got 256");
  c = Call(), c.batch = 65536, expect_invalid(c, "batch");
  c = Call(), c.batch = 65535, c.n = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // empty: accepted, nothing launched
  c = Call(), c.n = 65535 * 128 + 1, expect_invalid(c, "n");
  c = Call(), c.n = -1, expect_invalid(c, "n");
  c = Call(), c.k = 0, expect_invalid(c, "k");
  c = Call(), c.eps = 1e-45f, expect_invalid(c, "eps", "got 1e-45");
  c = Call(), c.eps = std::numeric_limits<float>::min(), expect_valid_without_gpu(c);
  c = Call(), c.w = nullptr, expect_invalid(c, "w");
  c = Call(), c.w = static_cast<const char*>(kW) + 1, expect_invalid(c, "w", "aligned");
  c = Call(), c.scale = reinterpret_cast<float*>(reinterpret_cast<char*>(kScale) + 2), expect_invalid(c, "scale");
  c = Call(), c.w_row_stride = -1, expect_invalid(c, "w_row_stride");
  c = Call(), c.batch = 2, c.w_batch_stride = -1, c.q_batch_stride = 60000, expect_invalid(c, "w_batch_stride");
  c = Call(), c.w_row_stride = kMax / 2, expect_invalid(c, "w_row_stride", "2^63");
  c = Call(), c.q_row_stride = 299, expect_invalid(c, "q_row_stride", "must not overlap");
  c = Call(), c.batch = 2, c.q_batch_stride = 59999, expect_invalid(c, "q_batch_stride", "must not overlap");
  c = Call(), c.batch = 2, c.q_batch_stride = 60000, expect_valid_without_gpu(c);
  c = Call(), c.n = 1, c.w_row_stride = -9, c.q_row_stride = -9, expect_valid_without_gpu(c);  // unused strides
  c = Call(), c.q = const_cast<void*>(kW), expect_invalid(c, "q", "overlaps w");
  c = Call(), c.scale = reinterpret_cast<float*>(static_cast<char*>(kQ) + 59996),
  expect_invalid(c, "scale", "overlaps q");
  c = Call(), c.scale = reinterpret_cast<float*>(static_cast<char*>(kQ) + 60000), expect_valid_without_gpu(c);
  c = Call(), c.k = c.w_row_stride = c.q_row_stride = (int64_t{1} << 31) - 129, c.n = 1;
  c.q = reinterpret_cast<void*>(uintptr_t(1) << 40), c.scale = reinterpret_cast<float*>(uintptr_t(2) << 40);
  expect_valid_without_gpu(c);
  c.k = c.w_row_stride = c.q_row_stride = (int64_t{1} << 31) - 128, expect_invalid(c, "k", "2147483519");

  // Empty (no rows or no weights): every pointer may be null, every value (strides included) is checked
  c = Call(), c.n = 0, c.w = nullptr, c.q = nullptr, c.scale = nullptr;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.batch = 2, c.q_batch_stride = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // weights of no rows do not overlap
  c.w_batch_stride = -1, expect_invalid(c, "w_batch_stride", ">= 0");
  c = Call(), c.batch = 0, c.w = nullptr, c.eps = 0.0f, expect_invalid(c, "eps");
  EXPECT(fp8quant_requantize_ue8m0(nullptr, nullptr, 1, 0, 300, 0, 300, nullptr, 0, 300, nullptr, 128, 128, 1e-4f,
                                   nullptr) == FP8QUANT_SUCCESS);
}

// On a supported GPU: w [130, 200] of 1.0 with 448 in block (0, 0), -672 in block (0, 1) and
// zeros in block (1, 1): scales 1, 1.5, 1/448 and eps / 448.
bool test_launch() {
  if (fp8quant_check_device(nullptr, nullptr) != FP8QUANT_SUCCESS) return false;
  const int64_t n = 130, k = 200;
  std::vector<uint16_t> w(n * k, bf16(1.0f));
  w[5] = bf16(448.0f);
  w[150] = bf16(-672.0f);
  for (int64_t r = 128; r < n; ++r) {
    for (int64_t c = 128; c < k; ++c) w[r * k + c] = 0;
  }
  void *dw, *dq;
  float* ds;
  cudaMalloc(&dw, w.size() * 2);
  cudaMalloc(&dq, n * k);
  cudaMalloc(reinterpret_cast<void**>(&ds), 4 * 4);
  cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dq, 0xA5, n * k);
  EXPECT(fp8quant_per_block_quant(dw, FP8QUANT_DTYPE_BFLOAT16, 1, n, k, 0, k, dq, 0, k, ds, 128, 128, 0, 1e-4f,
                                  nullptr) == FP8QUANT_SUCCESS);
  float s[4];
  std::vector<uint8_t> q(n * k);
  cudaMemcpy(s, ds, sizeof(s), cudaMemcpyDeviceToHost);
  cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost);
  EXPECT(s[0] == 1.0f && s[1] == 1.5f && s[2] == 1.0f / 448.0f && s[3] == 1e-4f / 448.0f);
  EXPECT(q[5] == 0x7E && q[0] == 0x38 && q[150] == 0xFE && q[129 * k + 199] == 0x00);
  EXPECT(q[128 * k] == 0x7E);  // 1.0 / (1 / 448) = 448
  free_all(dw, dq, ds);
  return true;
}

}  // namespace

int main() {
  test_validation();
  return finish("weights API", test_launch());
}
