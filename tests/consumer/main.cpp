// fp8quant_consumer: quantizes a bf16 matrix read from a file through the C API and writes q and
// the whole scale buffer to files, so that a test can compare them with the Python path.
//
//   fp8quant_consumer M K LAYOUT UE8M0 X_FILE Q_FILE SCALE_FILE
//
// LAYOUT is row, mn, mn_tma or packed_ue8m0; UE8M0 is 0 or 1; X_FILE holds M*K bf16 values
// (row-major, little-endian). Group size 128, eps 1e-10. Exit status: 0 on success, the
// fp8quant status code when a call fails (2 without a CUDA device), 10 for a bad command line,
// a file or CUDA runtime error.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fp8quant/fp8quant.h>

namespace {

int fail(fp8quant_status_t status, const char* what) {
  std::fprintf(stderr, "%s: %s: %s\n", what, fp8quant_status_string(status), fp8quant_last_error());
  return static_cast<int>(status);
}

constexpr int kOtherError = 10;

int cuda_fail(cudaError_t err, const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
  return kOtherError;
}

bool read_file(const char* path, void* data, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  return in.read(static_cast<char*>(data), static_cast<std::streamsize>(bytes)) && in.gcount() == std::streamsize(bytes);
}

bool write_file(const char* path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  return static_cast<bool>(out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s M K LAYOUT UE8M0 X_FILE Q_FILE SCALE_FILE\n", argv[0]);
    return kOtherError;
  }
  const int64_t m = std::atoll(argv[1]), k = std::atoll(argv[2]);
  const std::string layout_name = argv[3];
  const int ue8m0 = std::atoi(argv[4]);
  const fp8quant_scale_layout_t layout = layout_name == "row"            ? FP8QUANT_SCALE_ROW
                                         : layout_name == "mn"           ? FP8QUANT_SCALE_MN
                                         : layout_name == "mn_tma"       ? FP8QUANT_SCALE_MN_TMA
                                         : layout_name == "packed_ue8m0" ? FP8QUANT_SCALE_PACKED_UE8M0
                                                                         : static_cast<fp8quant_scale_layout_t>(-1);
  if (layout == static_cast<fp8quant_scale_layout_t>(-1)) {
    std::fprintf(stderr, "LAYOUT: '%s' is not one of row, mn, mn_tma, packed_ue8m0\n", argv[3]);
    return kOtherError;
  }
  constexpr int64_t kGroupSize = 128;
  std::printf("fp8quant %d, built with CUDA %d\n", fp8quant_version(), fp8quant_cuda_version());

  // Device: compute capability 9.0 (sm_90a) or 10.x (sm_100f)
  int major = 0, minor = 0;
  if (const fp8quant_status_t st = fp8quant_check_device(&major, &minor); st != FP8QUANT_SUCCESS) {
    return fail(st, "fp8quant_check_device");
  }
  std::printf("device: compute capability %d.%d\n", major, minor);

  // Scale buffer of the layout (the C API checks the layout and the shape)
  fp8quant_scale_shape_t shape;
  if (const fp8quant_status_t st = fp8quant_scale_shape(layout, 1, m, k / kGroupSize, &shape); st != FP8QUANT_SUCCESS) {
    return fail(st, "fp8quant_scale_shape");
  }
  std::vector<uint16_t> x(static_cast<size_t>(m * k));
  if (!read_file(argv[5], x.data(), x.size() * sizeof(uint16_t))) {
    std::fprintf(stderr, "X_FILE: cannot read %lld bf16 values from %s\n", static_cast<long long>(x.size()), argv[5]);
    return kOtherError;
  }
  std::vector<uint8_t> q(x.size());
  std::vector<uint32_t> scale(static_cast<size_t>(shape.numel));  // fp32 or packed UE8M0 words

  // Quantize
  void *dx = nullptr, *dq = nullptr, *dscale = nullptr;
  cudaError_t err = cudaMalloc(&dx, x.size() * sizeof(uint16_t));
  if (err == cudaSuccess) err = cudaMalloc(&dq, q.size());
  if (err == cudaSuccess) err = cudaMalloc(&dscale, scale.size() * sizeof(uint32_t));
  if (err == cudaSuccess) err = cudaMemcpy(dx, x.data(), x.size() * sizeof(uint16_t), cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return cuda_fail(err, "allocating and filling device buffers");
  const fp8quant_status_t st = fp8quant_per_token_group_quant(
      dx, FP8QUANT_DTYPE_BFLOAT16, /*batch=*/1, m, k, /*x_batch_stride=*/0, /*x_row_stride=*/k, dq,
      /*q_batch_stride=*/0, /*q_row_stride=*/k, dscale, layout, ue8m0, kGroupSize, /*eps=*/1e-10f,
      /*stream=*/nullptr);
  if (st != FP8QUANT_SUCCESS) return fail(st, "fp8quant_per_token_group_quant");
  err = cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost);
  if (err == cudaSuccess) err = cudaMemcpy(scale.data(), dscale, scale.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return cuda_fail(err, "copying the results back");
  cudaFree(dx);
  cudaFree(dq);
  cudaFree(dscale);

  if (!write_file(argv[6], q.data(), q.size())) {
    std::fprintf(stderr, "Q_FILE: cannot write %s\n", argv[6]);
    return kOtherError;
  }
  if (!write_file(argv[7], scale.data(), scale.size() * sizeof(uint32_t))) {
    std::fprintf(stderr, "SCALE_FILE: cannot write %s\n", argv[7]);
    return kOtherError;
  }
  std::printf("quantized %lldx%lld (%s%s): %lld scale words\n", static_cast<long long>(m), static_cast<long long>(k),
              layout_name.c_str(), ue8m0 && layout != FP8QUANT_SCALE_PACKED_UE8M0 ? "+ue8m0" : "",
              static_cast<long long>(shape.numel));
  return 0;
}
