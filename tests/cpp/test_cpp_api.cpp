// The C++ layer (fp8quant.hpp): failures become fp8quant::Error with the status and the message
// naming the argument; no GPU needed.
#include <cstdio>
#include <cstring>
#include <string>

#include "fp8quant/fp8quant.hpp"

namespace {

int failures = 0;

void expect(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "failed: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  const fp8quant_scale_shape_t s = fp8quant::scale_shape(FP8QUANT_SCALE_PACKED_UE8M0, 1, 5, 7);
  expect(s.rows == 8 && s.cols == 2 && s.numel == 16, "scale_shape of packed_ue8m0 [5, 7 groups]");

  alignas(16) unsigned char buf[64] = {};
  try {
    fp8quant::per_token_group_quant(buf, FP8QUANT_DTYPE_BFLOAT16, 4, 256, buf, buf, FP8QUANT_SCALE_ROW, 96);
    expect(false, "group_size 96 throws");
  } catch (const fp8quant::Error& e) {
    expect(e.status() == FP8QUANT_ERROR_INVALID_ARGUMENT, "status is INVALID_ARGUMENT");
    expect(std::string(e.what()) == "FP8QUANT_ERROR_INVALID_ARGUMENT: group_size: must be 32, 64 or 128, got 96",
           "message names the status and the argument");
  }
  try {
    fp8quant::scale_shape(FP8QUANT_SCALE_ROW, 1, -1, 1);
    expect(false, "negative m throws");
  } catch (const fp8quant::Error& e) {
    expect(std::strstr(e.what(), "m: must be >= 0") != nullptr, "scale_shape message names m");
  }
  try {  // the C API's eps floor holds for the wrapper's default arguments too
    fp8quant::per_token_group_quant(buf, FP8QUANT_DTYPE_BFLOAT16, 4, 256, buf, buf, FP8QUANT_SCALE_ROW, 128, false,
                                    1e-45f);
    expect(false, "eps 1e-45 throws");
  } catch (const fp8quant::Error& e) {
    expect(std::strstr(e.what(), "eps: must be finite and at least the smallest normal float32") != nullptr,
           "eps message");
  }
  fp8quant::per_token_group_quant(nullptr, FP8QUANT_DTYPE_FLOAT32, 0, 128, nullptr, nullptr, FP8QUANT_SCALE_MN);

  const bool before = fp8quant::set_pdl(false);
  expect(!fp8quant::pdl_enabled(), "set_pdl(false) turns PDL off");
  expect(!fp8quant::set_pdl(before), "set_pdl returns the previous setting");
  expect(fp8quant::pdl_enabled() == before, "and restores it");

  if (failures) return 1;
  std::printf("all C++ layer checks passed\n");
  return 0;
}
