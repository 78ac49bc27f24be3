// The RMSNorm C API (fp8quant_rms_norm, fp8quant_rms_norm_quant): every refusal names its
// argument; where a supported GPU is present, one launch of each against values computed by hand.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "fixture.hpp"
#include "fp8quant/fp8quant.h"

namespace {

// Addresses far apart and 16-byte aligned, never dereferenced by a refused call
void* const kX = fake_address<void>(1);
void* const kResidual = fake_address<void>(2);
void* const kWeight = fake_address<void>(3);
void* const kQ = fake_address<void>(4);
void* const kScale = fake_address<void>(5);

struct Call {
  const void* x = kX;
  void* residual = kResidual;
  const void* weight = kWeight;
  fp8quant_dtype_t dtype = FP8QUANT_DTYPE_BFLOAT16;
  int64_t m = 5, h = 256, x_row_stride = 256, residual_row_stride = 256;
  float eps = 1e-6f;
  void* q = kQ;
  int64_t q_row_stride = 256;
  void* scale = kScale;
  fp8quant_scale_layout_t layout = FP8QUANT_SCALE_MN_TMA;
  int ue8m0 = 0;
  int64_t group_size = 128;
  float quant_eps = 1e-10f;
  bool quantize = true;

  fp8quant_status_t run() const {
    if (!quantize) {
      return fp8quant_rms_norm(x, residual, weight, dtype, m, h, x_row_stride, residual_row_stride, eps, q,
                               q_row_stride, nullptr);
    }
    return fp8quant_rms_norm_quant(x, residual, weight, dtype, m, h, x_row_stride, residual_row_stride, eps, q,
                                   q_row_stride, scale, layout, ue8m0, group_size, quant_eps, nullptr);
  }
};

void test_validation() {
  Call c;
  if (!have_gpu()) EXPECT(c.run() == FP8QUANT_ERROR_NO_DEVICE);
  c.dtype = FP8QUANT_DTYPE_FLOAT32, expect_invalid(c, "dtype", "BFLOAT16 or FLOAT16");
  c = Call(), c.h = 0, expect_invalid(c, "h");
  c = Call(), c.h = 200, expect_invalid(c, "h", "multiple of 16");
  c = Call(), c.h = 16384 + 128, c.x_row_stride = c.residual_row_stride = c.q_row_stride = c.h;
  expect_invalid(c, "h", "at most 16384");
  c = Call(), c.h = 192, c.x_row_stride = c.residual_row_stride = c.q_row_stride = 192;
  expect_invalid(c, "h", "multiple of group_size");
  c = Call(), c.m = -1, expect_invalid(c, "m");
  c = Call(), c.eps = -1.0f, expect_invalid(c, "eps");
  c = Call(), c.quant_eps = 0.0f, expect_invalid(c, "quant_eps", "smallest normal float32");
  c = Call(), c.eps = std::numeric_limits<float>::infinity(), expect_invalid(c, "eps");
  c = Call(), c.group_size = 16, expect_invalid(c, "group_size");
  c = Call(), c.layout = FP8QUANT_SCALE_PACKED_UE8M0, expect_invalid(c, "ue8m0");
  c = Call(), c.layout = static_cast<fp8quant_scale_layout_t>(9), expect_invalid(c, "scale_layout");
  c = Call(), c.m = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // empty: accepted, nothing launched
  c.x = nullptr, c.residual = nullptr, c.weight = nullptr, c.q = nullptr, c.scale = nullptr;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // no pointer is examined
  c.quantize = false;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.h = 24, expect_invalid(c, "h");  // the values are
  c = Call(), c.x = nullptr, expect_invalid(c, "x", "null");
  c = Call(), c.weight = nullptr, expect_invalid(c, "weight", "null");
  c = Call(), c.q = nullptr, expect_invalid(c, "q", "null");
  c = Call(), c.quantize = false, c.q = nullptr, expect_invalid(c, "y", "null");
  c = Call(), c.scale = nullptr, expect_invalid(c, "scale", "null");
  c = Call(), c.x = static_cast<const char*>(kX) + 2, expect_invalid(c, "x", "16-byte aligned");
  c = Call(), c.x_row_stride = 260, expect_invalid(c, "x_row_stride", "multiple of 8 elements");
  c = Call(), c.residual_row_stride = 100, expect_invalid(c, "residual_row_stride", "must not overlap");
  c = Call(), c.q_row_stride = 100, expect_invalid(c, "q_row_stride", "must not overlap");
  c = Call(), c.residual = const_cast<void*>(c.x), expect_invalid(c, "residual", "overlaps x");
  c = Call(), c.q = kResidual, expect_invalid(c, "q", "overlaps residual");
  c = Call(), c.scale = kQ, expect_invalid(c, "scale", "overlaps q");
  c = Call(), c.residual = nullptr;
  if (!have_gpu()) EXPECT(c.run() == FP8QUANT_ERROR_NO_DEVICE);  // no residual: accepted
}

// One row of 128: x = [12, 16, 0...], residual = [4, 0...], weight 2: h = [16, 16, 0...], mean
// square 512 / 128 = 4, r = 0.5, y = [16, 16, 0...] (docs/contract.md, "RMSNorm"); one group:
// amax 16, scale 16 / 448, q = [448, 448, 0...] (0x7E).
void test_launch() {
  if (!have_gpu()) return;
  std::vector<uint16_t> x(128, 0), residual(128, 0), weight(128, bf16(2.0f));
  x[0] = bf16(12.0f), x[1] = bf16(16.0f), residual[0] = bf16(4.0f);
  void *dx, *dr, *dw, *dy, *dq, *ds;
  cudaMalloc(&dx, 256), cudaMalloc(&dr, 256), cudaMalloc(&dw, 256), cudaMalloc(&dy, 256), cudaMalloc(&dq, 128);
  cudaMalloc(&ds, 16);
  cudaMemcpy(dx, x.data(), 256, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, weight.data(), 256, cudaMemcpyHostToDevice);
  cudaMemcpy(dr, residual.data(), 256, cudaMemcpyHostToDevice);
  EXPECT(fp8quant_rms_norm(dx, dr, dw, FP8QUANT_DTYPE_BFLOAT16, 1, 128, 128, 128, 0.0f, dy, 128, nullptr) ==
         FP8QUANT_SUCCESS);
  std::vector<uint16_t> y(128), h(128);
  cudaMemcpy(y.data(), dy, 256, cudaMemcpyDeviceToHost);
  cudaMemcpy(h.data(), dr, 256, cudaMemcpyDeviceToHost);
  EXPECT(h[0] == bf16(16.0f) && h[1] == bf16(16.0f));
  EXPECT(y[0] == bf16(16.0f) && y[1] == bf16(16.0f) && y[2] == 0);

  cudaMemcpy(dr, residual.data(), 256, cudaMemcpyHostToDevice);
  cudaMemset(ds, 0xA5, 16);
  EXPECT(fp8quant_rms_norm_quant(dx, dr, dw, FP8QUANT_DTYPE_BFLOAT16, 1, 128, 128, 128, 0.0f, dq, 128, ds,
                                 FP8QUANT_SCALE_MN_TMA, 0, 128, 1e-10f, nullptr) == FP8QUANT_SUCCESS);
  std::vector<uint8_t> q(128);
  float s[4];
  cudaMemcpy(q.data(), dq, 128, cudaMemcpyDeviceToHost);
  cudaMemcpy(s, ds, 16, cudaMemcpyDeviceToHost);
  EXPECT(q[0] == 0x7E && q[1] == 0x7E && q[2] == 0);
  EXPECT(s[0] == 16.0f / 448.0f && s[1] == 0.0f && s[2] == 0.0f && s[3] == 0.0f);  // padding rows zeroed
  free_all(dx, dr, dw, dy, dq, ds);
}

}  // namespace

int main() {
  test_validation();
  test_launch();
  if (failures == 0) std::printf("all norm API checks passed\n");
  return failures == 0 ? 0 : 1;
}
