// The scale-transform C API (pack.h) and fp8quant_requantize_ue8m0: every refusal names its
// argument; where a supported GPU is present, launches against values written out by hand,
// padding and the first_invalid report included.
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
float* const kSrc = fake_address<float>(1);
float* const kDst = fake_address<float>(2);
uint64_t* const kFlag = fake_address<uint64_t>(3);

void test_validation() {
  auto* words = reinterpret_cast<int32_t*>(kDst);
  const auto row = FP8QUANT_SCALE_ROW, tma = FP8QUANT_SCALE_MN_TMA, packed = FP8QUANT_SCALE_PACKED_UE8M0;
  expect_valid_without_gpu([&] { return fp8quant_convert_scales(kSrc, row, kDst, tma, 2, 5, 3, nullptr); });
  expect_invalid_argument(fp8quant_convert_scales(kSrc, packed, kDst, tma, 1, 5, 3, nullptr), "src_layout");
  expect_invalid_argument(fp8quant_convert_scales(kSrc, row, kDst, packed, 1, 5, 3, nullptr), "dst_layout");
  expect_invalid_argument(fp8quant_convert_scales(kSrc, row, kDst, tma, -1, 5, 3, nullptr), "batch");
  expect_invalid_argument(fp8quant_convert_scales(kSrc, row, kDst, tma, 1, -1, 3, nullptr), "m");
  expect_invalid_argument(fp8quant_convert_scales(kSrc, row, kDst, tma, 1, 5, 0, nullptr), "num_groups");
  expect_invalid_argument(fp8quant_convert_scales(nullptr, row, kDst, tma, 1, 5, 3, nullptr), "src", "null");
  expect_invalid_argument(fp8quant_convert_scales(kSrc + 1, row, kSrc, tma, 1, 5, 3, nullptr), "dst", "overlaps src");
  expect_valid_without_gpu(
      [&] { return fp8quant_convert_scales(kSrc + 24, row, kSrc, tma, 1, 5, 3, nullptr); });    // just apart
  EXPECT(fp8quant_convert_scales(kSrc, row, kDst, tma, 1, 0, 3, nullptr) == FP8QUANT_SUCCESS);  // empty
  expect_invalid_argument(fp8quant_convert_scales(kSrc, row, kDst, tma, 1, int64_t{1} << 40, int64_t{1} << 30, nullptr),
                          "m", "overflow");

  expect_valid_without_gpu([&] { return fp8quant_pack_ue8m0(kSrc, tma, words, 1, 5, 7, kFlag, nullptr); });
  expect_invalid_argument(fp8quant_pack_ue8m0(kSrc, packed, words, 1, 5, 7, kFlag, nullptr), "src_layout");
  expect_invalid_argument(
      fp8quant_pack_ue8m0(kSrc, tma, reinterpret_cast<int32_t*>(kSrc) + 4, 1, 5, 7, nullptr, nullptr), "dst",
      "overlaps src");  // src's mn_tma buffer is 8 rows x 7 groups
  expect_invalid_argument(
      fp8quant_pack_ue8m0(kSrc, tma, words, 1, 5, 7, reinterpret_cast<uint64_t*>(kDst + 1), nullptr), "first_invalid",
      "8-byte aligned");
  expect_invalid_argument(
      fp8quant_pack_ue8m0(kSrc, tma, words, 1, 5, 7, reinterpret_cast<uint64_t*>(kDst + 2), nullptr), "first_invalid",
      "overlaps dst");
  expect_invalid_argument(
      fp8quant_unpack_ue8m0(reinterpret_cast<int32_t*>(kSrc), kDst, packed, 1, 5, 7, nullptr, nullptr), "dst_layout");
  expect_invalid_argument(
      fp8quant_unpack_ue8m0(reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(kSrc) + 2), kDst, row, 1, 5,
                            7, nullptr, nullptr),
      "src", "4-byte aligned");
  expect_invalid_argument(fp8quant_sm100_weight_scales(kSrc, 1, 300, 7, 0, words, nullptr, nullptr), "block_n");
  expect_invalid_argument(fp8quant_sm100_weight_scales(kSrc, 1, 300, 0, 128, words, nullptr, nullptr), "k_blocks");
  expect_invalid_argument(fp8quant_sm100_weight_scales(kSrc, 1, -1, 7, 128, words, nullptr, nullptr), "n");
  expect_valid_without_gpu([&] { return fp8quant_sm100_weight_scales(kSrc, 2, 300, 7, 128, words, kFlag, nullptr); });
  // Sizes past 64 bits name the argument that overflows: the weight's rows are n, not m
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  expect_invalid_argument(fp8quant_sm100_weight_scales(kSrc, 1, kMax, 4, 1, words, nullptr, nullptr), "n", "overflow");
  expect_invalid_argument(fp8quant_pack_ue8m0(kSrc, tma, words, int64_t{1} << 50, 4, 1 << 10, nullptr, nullptr),
                          "batch", "overflow");

  // Nothing to convert (no rows or no batches): every pointer may be null, the values are still checked
  EXPECT(fp8quant_pack_ue8m0(nullptr, row, nullptr, 1, 0, 4, nullptr, nullptr) == FP8QUANT_SUCCESS);
  EXPECT(fp8quant_pack_ue8m0(reinterpret_cast<const float*>(reinterpret_cast<const char*>(kSrc) + 2), row, words, 1, 0,
                             4, reinterpret_cast<uint64_t*>(kDst + 1), nullptr) == FP8QUANT_SUCCESS);  // not examined
  EXPECT(fp8quant_convert_scales(nullptr, row, nullptr, tma, 0, 5, 4, nullptr) == FP8QUANT_SUCCESS);
  EXPECT(fp8quant_unpack_ue8m0(nullptr, nullptr, row, 3, 0, 4, nullptr, nullptr) == FP8QUANT_SUCCESS);
  EXPECT(fp8quant_sm100_weight_scales(nullptr, 1, 0, 4, 128, nullptr, nullptr, nullptr) == FP8QUANT_SUCCESS);
  expect_invalid_argument(fp8quant_pack_ue8m0(nullptr, packed, nullptr, 1, 0, 4, nullptr, nullptr), "src_layout");
  expect_invalid_argument(fp8quant_convert_scales(nullptr, row, nullptr, tma, 0, 5, 0, nullptr), "num_groups");
  expect_invalid_argument(fp8quant_sm100_weight_scales(nullptr, 1, 0, 4, 0, nullptr, nullptr, nullptr), "block_n");

  const void* w = kSrc;
  void* q = kDst;
  float* s = reinterpret_cast<float*>(kFlag);
  expect_valid_without_gpu([&] {
    return fp8quant_requantize_ue8m0(w, kSrc + 100000, 1, 200, 300, 0, 300, q, 0, 300, s, 128, 128, 1e-4f, nullptr);
  });
  expect_invalid_argument(
      fp8quant_requantize_ue8m0(w, nullptr, 1, 200, 300, 0, 300, q, 0, 300, s, 128, 128, 1e-4f, nullptr), "w_scale",
      "null");
  expect_invalid_argument(fp8quant_requantize_ue8m0(w, s, 1, 200, 300, 0, 300, q, 0, 300, s, 128, 128, 1e-4f, nullptr),
                          "scale", "overlaps w_scale");
  expect_invalid_argument(
      fp8quant_requantize_ue8m0(w, kSrc + 100000, 1, 200, 300, 0, 300, q, 0, 300, s, 64, 128, 1e-4f, nullptr),
      "block_n");
}

float pow2(int k) {
  float f = 1.0f;
  for (; k > 0; --k) f *= 2.0f;
  for (; k < 0; ++k) f *= 0.5f;
  return f;
}

// On a supported GPU: scales [5, 3] row-major, packed (MN-major, 8 rows, one word a row), and
// unpacked back to mn_tma; then one bad value reported by its index.
bool test_launch() {
  if (fp8quant_check_device(nullptr, nullptr) != FP8QUANT_SUCCESS) return false;
  float host[15];
  for (int i = 0; i < 15; ++i) host[i] = pow2(i - 7);  // bytes 0x78 + i
  float *src, *back;
  int32_t* words;
  uint64_t* flag;
  cudaMalloc(reinterpret_cast<void**>(&src), sizeof(host));
  cudaMalloc(reinterpret_cast<void**>(&words), 8 * 4);
  cudaMalloc(reinterpret_cast<void**>(&back), 3 * 8 * 4);
  cudaMalloc(reinterpret_cast<void**>(&flag), 8);
  cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice);
  cudaMemset(words, 0xA5, 8 * 4);
  cudaMemset(back, 0xA5, 3 * 8 * 4);
  cudaMemset(flag, 0xFF, 8);
  EXPECT(fp8quant_pack_ue8m0(src, FP8QUANT_SCALE_ROW, words, 1, 5, 3, flag, nullptr) == FP8QUANT_SUCCESS);
  EXPECT(fp8quant_unpack_ue8m0(words, back, FP8QUANT_SCALE_MN_TMA, 1, 5, 3, nullptr, nullptr) == FP8QUANT_SUCCESS);
  uint32_t w[8];
  float b[24];
  uint64_t first = 0;
  cudaMemcpy(w, words, sizeof(w), cudaMemcpyDeviceToHost);
  cudaMemcpy(b, back, sizeof(b), cudaMemcpyDeviceToHost);
  cudaMemcpy(&first, flag, 8, cudaMemcpyDeviceToHost);
  EXPECT(w[0] == 0x007A7978u && w[4] == 0x00868584u && w[5] == 0 && w[7] == 0);  // rows 0 and 4; padding rows 0
  EXPECT(first == UINT64_MAX);
  EXPECT(b[0] == host[0] && b[4] == host[12] && b[8 + 4] == host[13] && b[16 + 4] == host[14]);
  EXPECT(b[5] == 0.0f && b[7] == 0.0f && b[23] == 0.0f);  // padding rows 0

  host[11] = 3.0f;  // row 3, group 2
  host[13] = 0.1f;  // row 4, group 1: a later index
  cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice);
  EXPECT(fp8quant_pack_ue8m0(src, FP8QUANT_SCALE_ROW, words, 1, 5, 3, flag, nullptr) == FP8QUANT_SUCCESS);
  cudaMemcpy(w, words, sizeof(w), cudaMemcpyDeviceToHost);
  cudaMemcpy(&first, flag, 8, cudaMemcpyDeviceToHost);
  EXPECT(first == 11 && (w[3] >> 16 & 0xFF) == 0xFF);
  free_all(src, words, back, flag);
  return true;
}

}  // namespace

int main() {
  test_validation();
  return finish("pack API", test_launch());
}
