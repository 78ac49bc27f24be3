// Tests of the C API that need no GPU (validation, layout math, statuses), plus one launch
// checked against hand-computed values where a supported GPU is present.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "fixture.hpp"
#include "fp8quant/fp8quant.h"

namespace {

// Addresses far enough apart for the buffers of every call below, 256-byte aligned. Never
// dereferenced by a failing call: validation fails (or M == 0 returns) before any device access.
const void* const kX = kFakeX;
void* const kQ = kFakeQ;
void* const kScale = kFakeScale;

// A well-formed call for 2-D bf16 input (x, q and scale at kX, kQ and kScale); each test breaks
// one argument.
struct Call : QuantArgs {
  fp8quant_scale_layout_t layout = FP8QUANT_SCALE_MN_TMA;
  int ue8m0 = 0;
  int64_t group_size = 128;
  float eps = 1e-10f;

  fp8quant_status_t run() const {
    return fp8quant_per_token_group_quant(x, dtype, batch, m, k, x_batch_stride, x_row_stride, q, q_batch_stride,
                                          q_row_stride, scale, layout, ue8m0, group_size, eps, nullptr);
  }
};

// The call passes validation: without a GPU it reports NO_DEVICE; with one it runs on device
// buffers at the same offsets from kX, kQ and kScale (1 MiB each, zero-filled).
void expect_accepted(Call call, const char* what) {
  fp8quant_status_t st;
  if (!have_gpu()) {
    st = call.run();
    if (st == FP8QUANT_ERROR_NO_DEVICE) return;
  } else {
    char* buf = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&buf), 3 << 20);
    cudaMemset(buf, 0, 3 << 20);
    const auto rebase = [&](const void* p) {
      return buf + (static_cast<const char*>(p) - static_cast<const char*>(kX));
    };
    call.x = rebase(call.x);
    call.q = rebase(call.q);
    call.scale = rebase(call.scale);
    st = call.run();
    if (cudaDeviceSynchronize() != cudaSuccess) st = FP8QUANT_ERROR_CUDA;
    cudaFree(buf);
    if (st == FP8QUANT_SUCCESS || st == FP8QUANT_ERROR_UNSUPPORTED_DEVICE) return;
  }
  std::fprintf(stderr, "%s: expected the call to pass validation, got %s: '%s'\n", what, fp8quant_status_string(st),
               fp8quant_last_error());
  ++failures;
}

// The last error contains `text`.
void expect_message_has(const std::string& text) {
  if (std::string(fp8quant_last_error()).find(text) == std::string::npos) {
    std::fprintf(stderr, "expected '%s' in the message '%s'\n", text.c_str(), fp8quant_last_error());
    ++failures;
  }
}

void test_statuses() {
  EXPECT(fp8quant_version() == 100);
  EXPECT(std::strcmp(fp8quant_status_string(FP8QUANT_SUCCESS), "FP8QUANT_SUCCESS") == 0);
  EXPECT(std::strcmp(fp8quant_status_string(FP8QUANT_ERROR_NO_DEVICE), "FP8QUANT_ERROR_NO_DEVICE") == 0);
  EXPECT(std::strcmp(fp8quant_status_string(static_cast<fp8quant_status_t>(99)), "FP8QUANT_UNKNOWN_STATUS") == 0);
  EXPECT(fp8quant_cuda_version() >= 12090 && fp8quant_cuda_version() % 10 == 0);
}

void test_scale_shape() {
  fp8quant_scale_shape_t s{};
  // M = 5 rows, G = 7 groups: Ma = 8, P = 2
  EXPECT(fp8quant_scale_shape(FP8QUANT_SCALE_ROW, 3, 5, 7, &s) == FP8QUANT_SUCCESS);
  EXPECT(s.rows == 5 && s.cols == 7 && s.row_stride == 7 && s.col_stride == 1 && s.batch_stride == 35 &&
         s.numel == 105);
  EXPECT(fp8quant_scale_shape(FP8QUANT_SCALE_MN, 1, 5, 7, &s) == FP8QUANT_SUCCESS);
  EXPECT(s.rows == 5 && s.cols == 7 && s.row_stride == 1 && s.col_stride == 5 && s.numel == 35);
  EXPECT(fp8quant_scale_shape(FP8QUANT_SCALE_MN_TMA, 2, 5, 7, &s) == FP8QUANT_SUCCESS);
  EXPECT(s.rows == 8 && s.cols == 7 && s.row_stride == 1 && s.col_stride == 8 && s.batch_stride == 56 &&
         s.numel == 112);
  EXPECT(fp8quant_scale_shape(FP8QUANT_SCALE_PACKED_UE8M0, 1, 5, 7, &s) == FP8QUANT_SUCCESS);
  EXPECT(s.rows == 8 && s.cols == 2 && s.row_stride == 1 && s.col_stride == 8 && s.numel == 16);
  EXPECT(fp8quant_scale_shape(FP8QUANT_SCALE_PACKED_UE8M0, 1, 0, 7, &s) == FP8QUANT_SUCCESS);
  EXPECT(s.rows == 0 && s.numel == 0);

  EXPECT(fp8quant_scale_shape(FP8QUANT_SCALE_ROW, 1, -1, 7, &s) == FP8QUANT_ERROR_INVALID_ARGUMENT);
  EXPECT(std::strncmp(fp8quant_last_error(), "m:", 2) == 0);
  EXPECT(fp8quant_scale_shape(static_cast<fp8quant_scale_layout_t>(9), 1, 1, 1, &s) == FP8QUANT_ERROR_INVALID_ARGUMENT);
  EXPECT(std::strncmp(fp8quant_last_error(), "scale_layout:", 13) == 0);
  EXPECT(fp8quant_scale_shape(FP8QUANT_SCALE_ROW, 1, 1, 1, nullptr) == FP8QUANT_ERROR_INVALID_ARGUMENT);
  EXPECT(fp8quant_scale_shape(FP8QUANT_SCALE_ROW, 1, int64_t{1} << 40, int64_t{1} << 40, &s) ==
         FP8QUANT_ERROR_INVALID_ARGUMENT);
  // The argument whose size overflows is named: the rows and groups fit, their batches do not
  expect_invalid_argument(fp8quant_scale_shape(FP8QUANT_SCALE_ROW, int64_t{1} << 50, 4, 1 << 10, &s), "batch",
                          "overflow");
  expect_invalid_argument(fp8quant_scale_shape(FP8QUANT_SCALE_ROW, 1, int64_t{1} << 60, 1, &s), "m", "overflow");
}

// Every public enum has int as its fixed underlying type in C++: any int (an unknown value the
// functions refuse included) is a value of the type, not undefined behavior.
template <typename E>
constexpr bool int_based() {
  return std::is_same_v<std::underlying_type_t<E>, int>;
}
static_assert(int_based<fp8quant_status_t>() && int_based<fp8quant_dtype_t>() && int_based<fp8quant_scale_layout_t>() &&
                  int_based<fp8quant_mx_scale_layout_t>() && int_based<fp8quant_mx_recipe_t>() &&
                  int_based<fp8quant_routing_status_t>(),
              "public enums are int-based in C++");

void test_validation() {
  Call c;
  c.dtype = static_cast<fp8quant_dtype_t>(7), expect_invalid(c, "x_dtype");
  c = Call(), c.layout = static_cast<fp8quant_scale_layout_t>(4), expect_invalid(c, "scale_layout");
  c = Call(), c.layout = FP8QUANT_SCALE_PACKED_UE8M0, expect_invalid(c, "ue8m0");
  c = Call(), c.group_size = 96, expect_invalid(c, "group_size");
  c = Call(), c.k = 200, expect_invalid(c, "k");
  c = Call(), c.k = 0, expect_invalid(c, "k");
  c = Call(), c.batch = 65536, expect_invalid(c, "batch");
  c = Call(), c.batch = -1, expect_invalid(c, "batch");
  c = Call(), c.m = -3, expect_invalid(c, "m");
  c = Call(), c.eps = 0.0f, expect_invalid(c, "eps");
  c = Call(), c.eps = -1.0f, expect_invalid(c, "eps");
  c = Call(), c.eps = 1.0f / 0.0f, expect_invalid(c, "eps");
  c = Call(), c.x = nullptr, expect_invalid(c, "x");
  c = Call(), c.q = nullptr, expect_invalid(c, "q");
  c = Call(), c.scale = nullptr, expect_invalid(c, "scale");
  c = Call(), c.x = static_cast<const char*>(kX) + 1, expect_invalid(c, "x");
  c = Call(), c.scale = static_cast<char*>(kScale) + 2, expect_invalid(c, "scale");
  c = Call(), c.x_row_stride = -256, expect_invalid(c, "x_row_stride");
  c = Call(), c.q_row_stride = 128, expect_invalid(c, "q_row_stride");
  c = Call(), c.batch = 2, c.q_batch_stride = 256, expect_invalid(c, "q_batch_stride");
  // 2^31 groups in one batch do not fit the device's int32 counters; the argument that overflows them is named
  c = Call(), c.m = int64_t{1} << 30, c.k = 128 * 4, expect_invalid(c, "m");
  c = Call(), c.m = 4, c.k = c.x_row_stride = c.q_row_stride = int64_t{1} << 40, expect_invalid(c, "k", "group_size");
  c = Call(), c.m = 4, c.k = c.x_row_stride = c.q_row_stride = int64_t{1} << 37;  // 2^30 groups
  expect_invalid(c, "k", "group slots");  // one tile of 4 rows already needs 2^32 of them

  // Empty problems succeed without touching the device or the pointers
  c = Call(), c.m = 0, c.x = nullptr, c.q = nullptr, c.scale = nullptr;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c = Call(), c.batch = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);
}

// An empty call checks every value (strides included) and no pointer (common.h)
void test_empty() {
  Call c;
  c.m = 0, c.x = nullptr, c.q = nullptr, c.scale = nullptr;
  c.batch = 2, c.q_batch_stride = 0;
  EXPECT(c.run() == FP8QUANT_SUCCESS);  // batches of no rows do not overlap
  c.x_batch_stride = -1, expect_invalid(c, "x_batch_stride", ">= 0");
  c.x_batch_stride = 0, c.q_batch_stride = -1, expect_invalid(c, "q_batch_stride", "must not overlap");
  c.q_batch_stride = 0, c.k = c.x_row_stride = c.q_row_stride = int64_t{1} << 40, expect_invalid(c, "k");
  c = Call(), c.m = 0, c.x = nullptr, c.q = nullptr, c.scale = nullptr;
  c.x_row_stride = c.q_row_stride = -7;  // a dimension of size 0 is never stepped over
  EXPECT(c.run() == FP8QUANT_SUCCESS);
  c.eps = 0.0f, expect_invalid(c, "eps");
  c = Call(), c.batch = 0, c.layout = static_cast<fp8quant_scale_layout_t>(9), expect_invalid(c, "scale_layout");
}

// eps below the smallest normal float32 makes eps / 448 zero, and an all-zero group 0 / 0 = NaN
void test_eps_floor() {
  Call c;
  c.eps = 1e-45f, expect_invalid(c, "eps");
  expect_message_has("got 1e-45");
  expect_message_has("1.1754944e-38");
  c.eps = 1e-39f, expect_invalid(c, "eps");  // subnormal
  c.eps = 3e-43f, expect_invalid(c, "eps");
  c.eps = std::numeric_limits<float>::min(), expect_accepted(c, "eps = FLT_MIN");
  c.eps = std::numeric_limits<float>::max(), expect_accepted(c, "eps = FLT_MAX");
  c.eps = std::numeric_limits<float>::quiet_NaN(), expect_invalid(c, "eps");
}

// The group-limit message gives the number it checked: the launched slots, padding included
void test_group_limit_message() {
  Call c;
  c.layout = FP8QUANT_SCALE_PACKED_UE8M0, c.ue8m0 = 1, c.k = 128;  // G = 1 group, 4 slots a row
  c.m = (int64_t{1} << 29) + 1;                                    // align(m, 4) = 2^29 + 4
  expect_invalid(c, "m");
  expect_message_has(std::to_string(4 * ((int64_t{1} << 29) + 4)));  // 2147483664, not m * G
}

// x's strides are checked like q's; strides of size-1 dimensions are never used
void test_strides() {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Call c;
  c.batch = 2, c.x_batch_stride = -1, c.q_batch_stride = 1024, expect_invalid(c, "x_batch_stride");
  c = Call(), c.m = 2, c.x_row_stride = kMax / 2, expect_invalid(c, "x_row_stride");  // x 2 bytes each
  c = Call(), c.batch = 2, c.q_batch_stride = 1024, c.x_batch_stride = kMax / 2 - 1,
  expect_invalid(c, "x_batch_stride");
  c = Call(), c.batch = 3, c.q_batch_stride = kMax / 2, expect_invalid(c, "q_batch_stride");
  c = Call(), c.m = 3, c.q_row_stride = kMax / 2, expect_invalid(c, "q_row_stride");
  // Unused strides may be anything (DLPack producers report some as 0 or negative)
  c = Call(), c.m = 1, c.x_row_stride = -7, c.q_row_stride = -9, expect_accepted(c, "m = 1, negative row strides");
  c = Call(), c.batch = 1, c.x_batch_stride = -3, c.q_batch_stride = -5,
  expect_accepted(c, "batch = 1, negative batch strides");
  c = Call(), c.m = 1, c.x_row_stride = kMax, c.q_row_stride = kMax, expect_accepted(c, "m = 1, huge row strides");
  // Rows of x may repeat (stride 0); batches of x too
  c = Call(), c.x_row_stride = 0, expect_accepted(c, "x_row_stride = 0");
  c = Call(), c.batch = 2, c.x_batch_stride = 0, c.q_batch_stride = 1024, expect_accepted(c, "x_batch_stride = 0");
}

// Outputs must not share bytes with x or with each other (the byte ranges first..last element)
void test_overlap() {
  Call c;
  c.q = const_cast<void*>(kX), expect_invalid(c, "q");
  expect_message_has("overlaps x");
  c = Call(), c.q = static_cast<char*>(const_cast<void*>(kX)) + 2046, expect_invalid(c, "q");  // x: 2048 bytes
  c = Call(), c.q = static_cast<char*>(const_cast<void*>(kX)) + 2048, expect_accepted(c, "q right after x");
  c = Call(), c.scale = static_cast<char*>(kQ) + 1020, expect_invalid(c, "scale");  // q: 1024 bytes
  expect_message_has("overlaps q");
  c = Call(), c.scale = const_cast<void*>(kX), expect_invalid(c, "scale");
  expect_message_has("overlaps x");
  c = Call(), c.scale = static_cast<char*>(kQ) + 1024, expect_accepted(c, "scale right after q");
}

void test_pdl_switch(int expected_default) {
  EXPECT(fp8quant_pdl_enabled() == expected_default);
  EXPECT(fp8quant_set_pdl(0) == expected_default);
  EXPECT(fp8quant_pdl_enabled() == 0);
  EXPECT(fp8quant_set_pdl(7) == 0);
  EXPECT(fp8quant_pdl_enabled() == 1);
  fp8quant_set_pdl(expected_default);
}

// bf16 bit pattern of a float that bf16 holds exactly.
// One launch on a supported GPU: row 0 has amax 448 (scale 1), row 1 amax 672 (scale 1.5).
// Returns whether it ran.
bool test_launch() {
  if (!have_gpu()) {
    Call c;  // well-formed: the library must report the missing device, not crash
    EXPECT(c.run() == FP8QUANT_ERROR_NO_DEVICE);
    EXPECT(std::strlen(fp8quant_last_error()) > 0);
    int major = -1;
    EXPECT(fp8quant_check_device(&major, nullptr) == FP8QUANT_ERROR_NO_DEVICE && major == -1);
    EXPECT(std::strncmp(fp8quant_last_error(), "no CUDA device", 14) == 0);
    return false;
  }
  int major = -1, minor = -1;
  const fp8quant_status_t device = fp8quant_check_device(&major, &minor);
  EXPECT(major >= 0 && minor >= 0);
  // Compute capability 9.0 runs the sm_90a code, every 10.x the sm_100f code
  const bool supported = (major == 9 && minor == 0) || major == 10;
  EXPECT(device == (supported ? FP8QUANT_SUCCESS : FP8QUANT_ERROR_UNSUPPORTED_DEVICE));
  const int64_t m = 2, k = 128;
  std::vector<uint16_t> x(m * k, bf16(1.0f));
  x[5] = bf16(448.0f);
  x[k + 7] = bf16(-672.0f);
  void *dx, *dq, *ds;
  cudaMalloc(&dx, x.size() * 2);
  cudaMalloc(&dq, m * k);
  cudaMalloc(&ds, 4 * 4);
  cudaMemset(ds, 0xFF, 16);
  cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
  const auto launch = [&] {
    return fp8quant_per_token_group_quant(dx, FP8QUANT_DTYPE_BFLOAT16, 1, m, k, 0, k, dq, 0, k, ds,
                                          FP8QUANT_SCALE_MN_TMA, 0, 128, 1e-10f, nullptr);
  };
  const fp8quant_status_t st = launch();
  if (!supported) {  // the launch is refused, naming the device
    EXPECT(st == FP8QUANT_ERROR_UNSUPPORTED_DEVICE);
    free_all(dx, dq, ds);
    return false;
  }
  EXPECT(st == FP8QUANT_SUCCESS);  // on a supported device UNSUPPORTED_DEVICE is a failure
  std::vector<uint8_t> q(m * k);
  float s[4];
  cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(s, ds, sizeof(s), cudaMemcpyDeviceToHost);
  EXPECT(s[0] == 1.0f && s[1] == 1.5f && s[2] == 0.0f && s[3] == 0.0f);  // rows 2, 3: padding
  EXPECT(q[5] == 0x7E && q[0] == 0x38);                                  // 448 -> 0x7E, 1.0 -> 0x38
  EXPECT(q[k + 7] == 0xFE && q[k] == 0x33);                              // -672/1.5 = -448; 1/1.5 -> 0.6875 = 0x33

  // A non-sticky error the caller left behind (a failed allocation) is not the launch's: the
  // call still succeeds, with PDL off and on
  const int pdl = fp8quant_pdl_enabled();
  for (const int with_pdl : {0, 1}) {
    fp8quant_set_pdl(with_pdl);
    void* huge = nullptr;
    EXPECT(cudaMalloc(&huge, size_t{1} << 62) != cudaSuccess);
    EXPECT(launch() == FP8QUANT_SUCCESS);
    cudaGetLastError();  // the caller's error is the caller's to clear
  }
  fp8quant_set_pdl(pdl);
  EXPECT(cudaDeviceSynchronize() == cudaSuccess);
  free_all(dx, dq, ds);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // --pdl-default=0: run with FP8QUANT_PDL=0 in the environment (a ctest of its own)
  const int pdl_default = argc > 1 && std::strcmp(argv[1], "--pdl-default=0") == 0 ? 0 : 1;
  test_statuses();
  test_scale_shape();
  test_validation();
  test_empty();
  test_eps_floor();
  test_group_limit_message();
  test_strides();
  test_overlap();
  test_pdl_switch(pdl_default);
  return finish("C API", test_launch());
}
