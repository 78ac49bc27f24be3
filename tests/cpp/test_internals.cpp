// Host-side internals no public call can reach: the DISPATCH_* macros refuse every value they do
// not list (instead of running some other instantiation), mn and mn_tma share one scale order,
// and the architecture choice covers compute capability 9.0 and the whole 10.x family.
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "api/device.hpp"
#include "common/dispatch.hpp"

namespace {

int failures = 0;

void expect(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "failed: %s (last error: '%s')\n", what, fp8quant_last_error());
    ++failures;
  }
}

bool message_starts_with(const char* prefix) {
  return std::strncmp(fp8quant_last_error(), prefix, std::strlen(prefix)) == 0;
}

// Every listed value runs the body once with its constant; anything else runs nothing and fails.
void test_dispatch() {
  int ran = 0;
  for (int64_t gs : {32, 64, 128}) {
    const fp8quant_status_t st = FP8QUANT_DISPATCH_GROUP_SIZE(gs, kGroupSize, [&] {
      ran += kGroupSize == gs;
      return FP8QUANT_SUCCESS;
    });
    expect(st == FP8QUANT_SUCCESS, "group sizes 32, 64, 128 dispatch");
  }
  expect(ran == 3, "each group size ran its own constant");
  for (int64_t gs : {0, 16, 96, 256}) {
    ran = 0;
    const fp8quant_status_t st = FP8QUANT_DISPATCH_GROUP_SIZE(gs, kGroupSize, [&] {
      ++ran;
      return FP8QUANT_SUCCESS;
    });
    expect(st == FP8QUANT_ERROR_INVALID_ARGUMENT && ran == 0, "an unlisted group size runs nothing");
    expect(message_starts_with("group_size: no kernel is compiled for value"), "the message names group_size");
  }

  ran = 0;
  const auto dtype_size = [&](fp8quant_dtype_t dtype, int* size) {
    return FP8QUANT_DISPATCH_DTYPE(dtype, T, [&] {
      *size = sizeof(T);
      ++ran;
      return FP8QUANT_SUCCESS;
    });
  };
  int size = 0;
  expect(dtype_size(FP8QUANT_DTYPE_FLOAT32, &size) == FP8QUANT_SUCCESS && size == 4, "float32 is float");
  expect(dtype_size(FP8QUANT_DTYPE_FLOAT16, &size) == FP8QUANT_SUCCESS && size == 2, "float16 is __half");
  expect(dtype_size(FP8QUANT_DTYPE_BFLOAT16, &size) == FP8QUANT_SUCCESS && size == 2, "bfloat16 is __nv_bfloat16");
  expect(ran == 3, "each dtype ran once");
  expect(dtype_size(static_cast<fp8quant_dtype_t>(3), &size) == FP8QUANT_ERROR_INVALID_ARGUMENT && ran == 3,
         "an unlisted dtype runs nothing");
  expect(message_starts_with("x_dtype: no kernel is compiled for value 3"), "the message names x_dtype");

  const auto order_of = [&](fp8quant_scale_layout_t layout, fp8quant::ScaleOrder* order) {
    return FP8QUANT_DISPATCH_SCALE_ORDER(layout, kOrder, [&] {
      *order = kOrder;
      return FP8QUANT_SUCCESS;
    });
  };
  using fp8quant::ScaleOrder;
  ScaleOrder order{};
  expect(order_of(FP8QUANT_SCALE_ROW, &order) == FP8QUANT_SUCCESS && order == ScaleOrder::kRow, "row order");
  expect(order_of(FP8QUANT_SCALE_MN, &order) == FP8QUANT_SUCCESS && order == ScaleOrder::kColumn, "mn: column");
  expect(order_of(FP8QUANT_SCALE_MN_TMA, &order) == FP8QUANT_SUCCESS && order == ScaleOrder::kColumn,
         "mn_tma: column, the same instantiation as mn");
  expect(order_of(FP8QUANT_SCALE_PACKED_UE8M0, &order) == FP8QUANT_SUCCESS && order == ScaleOrder::kPacked,
         "packed order");
  order = ScaleOrder::kRow;
  expect(order_of(static_cast<fp8quant_scale_layout_t>(4), &order) == FP8QUANT_ERROR_INVALID_ARGUMENT &&
             order == ScaleOrder::kRow,
         "an unlisted layout runs nothing");
  expect(message_starts_with("scale_layout: no kernel is compiled for value 4"), "the message names scale_layout");

  using fp8quant::ScaleTransform;
  const auto op_of = [&](ScaleTransform op, ScaleTransform* got) {
    return FP8QUANT_DISPATCH_SCALE_TRANSFORM(op, kOp, [&] {
      *got = kOp;
      return FP8QUANT_SUCCESS;
    });
  };
  ScaleTransform got{};
  for (const ScaleTransform op : {ScaleTransform::kConvert, ScaleTransform::kPack, ScaleTransform::kUnpack}) {
    expect(op_of(op, &got) == FP8QUANT_SUCCESS && got == op, "each scale transform reaches its constant");
  }
  got = ScaleTransform::kConvert;
  expect(
      op_of(static_cast<ScaleTransform>(7), &got) == FP8QUANT_ERROR_INVALID_ARGUMENT && got == ScaleTransform::kConvert,
      "an unlisted transform runs nothing");
  expect(message_starts_with("op: no kernel is compiled for value 7"), "the message names op");
}

void test_kernel_arch() {
  int arch = 0;
  expect(fp8quant::kernel_arch({9, 0, 132}, &arch) == FP8QUANT_SUCCESS && arch == 9, "9.0 runs sm_90a");
  expect(fp8quant::kernel_arch({10, 0, 148}, &arch) == FP8QUANT_SUCCESS && arch == 10, "10.0 (B200) runs sm_100f");
  arch = 0;
  expect(fp8quant::kernel_arch({10, 3, 148}, &arch) == FP8QUANT_SUCCESS && arch == 10, "10.3 (B300) runs sm_100f");
  for (const auto& [major, minor] :
       std::initializer_list<std::pair<int, int>>{{8, 0}, {8, 9}, {11, 0}, {12, 0}, {12, 1}}) {
    arch = -1;
    const fp8quant_status_t st = fp8quant::kernel_arch({major, minor, 1}, &arch);
    const std::string cc = std::to_string(major) + "." + std::to_string(minor);
    expect(st == FP8QUANT_ERROR_UNSUPPORTED_DEVICE && arch == -1, ("unsupported: " + cc).c_str());
    expect(std::strstr(fp8quant_last_error(), ("compute capability " + cc).c_str()) != nullptr,
           "the message names the device's compute capability");
  }
}

}  // namespace

int main() {
  test_dispatch();
  test_kernel_arch();
  if (failures) return 1;
  std::printf("all internal checks passed\n");
  return 0;
}
