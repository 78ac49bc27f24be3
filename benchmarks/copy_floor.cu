// The floor under per_token_group_quant's small shapes: chains of trivial kernels launched the
// way the quantizer is (programmatic dependent launch, 256-thread blocks, 32 bytes of input and
// 16 of output per thread), timed per call in a CUDA graph like `python -m fp8quant bench`, then
// grown one feature of the quantizer at a time:
//
//   empty     griddepcontrol.wait and launch_dependents, nothing else: launch and dependency cost
//   copy      + load 32 bytes, store 16 (the quantizer's traffic at bf16, without its arithmetic)
//   copy+pf   + an L2 prefetch of the thread's input before the wait, as the quantizer's first
//             wave does (every block here; up to M = 256 the whole grid is the first wave)
//   +scales   + one 4-byte store per eight threads (fp32 row-layout scales at group size 128)
//   +delay    +scales with 60 dependent integer instructions before the prefetch (a longer
//             prologue)
//   +math     +scales with the quantizer's arithmetic at bf16: max of |x| over a team of eight
//             lanes by shuffles, a scale, and 16 divisions of three instructions each
//   +rare     +math with its rare paths compiled in but not taken: a vote for infinite input and
//             a second reduction, IEEE division for tiny scales
//   +param    +math with a 96-byte kernel parameter instead of 32 bytes (the quantizer's is 128)
//
// Built with -DWITH_FP8QUANT and linked to libfp8quant, it also times the quantizer itself on the
// same buffers through the C API (row, row+ue8m0, mn and packed_ue8m0 scales).
//
// Each shape is M rows of K = 7168 bf16 (M * 7168 / 16 threads) of random input, first with
// buffers rotated through 256 MiB (input in DRAM), then with one buffer set (input in L2).
//
// Build: nvcc -O3 -arch=sm_90a -std=c++17 -o copy_floor benchmarks/copy_floor.cu
//   with the quantizer: add -DWITH_FP8QUANT -Iinclude -L<dir of libfp8quant.so> -l:libfp8quant.so
//   -Xlinker -rpath,<that dir> (an installed wheel: `python -c "import fp8quant, os;
//   print(os.path.dirname(fp8quant.__file__))"`)
// Run:   ./copy_floor [M ...]        (default: 64 128 256 2048)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#ifdef WITH_FP8QUANT
#include "fp8quant/quant.h"
#endif

#define CHECK(expr)                                                             \
  do {                                                                          \
    const cudaError_t err_ = (expr);                                            \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

namespace {

constexpr int kK = 7168;
constexpr int kGroupSize = 128;
constexpr int kThreads = 256;
constexpr size_t kRotationBytes = size_t{256} << 20;
constexpr int kCallsPerGraph = 1000;
constexpr int kReplays = 10;

enum Mode : int { kEmpty = 0, kCopy = 1, kPrefetch = 2, kScales = 4, kDelay = 8, kMath = 16, kRare = 32 };

// The kernel parameter: 32 bytes, or 32 + 8 * kPad with padding between the pointers and n.
template <int kPad>
struct Args {
  const uint4* x;
  uint4* q;
  float* scale;
  int64_t pad[kPad];
  int n;
  float eps;
};
template <>
struct Args<0> {
  const uint4* x;
  uint4* q;
  float* scale;
  int n;
  float eps;
};

// The quantizer's arithmetic on one thread's 16 bf16 values (packed in w), its team being the
// eight lanes around it; returns the scale and leaves the quotients' bits in out.
template <bool kRarePaths>
__device__ __forceinline__ float quantize(const uint32_t (&w)[8], float eps, uint32_t (&out)[4]) {
  float v[16];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    amax = fmaxf(amax, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
  }
#pragma unroll
  for (int offset = 4; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  const bool has_inf = amax == INFINITY;
  if (kRarePaths && __any_sync(0xFFFFFFFFu, has_inf)) {
    float finite = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) finite = fmaxf(finite, fabsf(v[i]) < INFINITY ? fabsf(v[i]) : 0.0f);
#pragma unroll
    for (int offset = 4; offset > 0; offset /= 2) finite = fmaxf(finite, __shfl_xor_sync(0xFFFFFFFFu, finite, offset));
    amax = finite;
  }
  amax = fmaxf(amax, eps);
  const float s = kRarePaths && amax < 0x1p-90f ? __fdiv_rn(amax, 448.0f) : amax * (1.0f / 448.0f);
  if (!kRarePaths || (s >= 0x1p-90f && !has_inf)) {
    const float r = 1.0f / s;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float q = v[i] * r;
      v[i] = __fmaf_rn(-__fmaf_rn(q, s, -v[i]), r, q);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = __fdiv_rn(v[i], s);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[i] = __float_as_uint(v[4 * i]) ^ __float_as_uint(v[4 * i + 1]) ^ __float_as_uint(v[4 * i + 2]) ^
             __float_as_uint(v[4 * i + 3]);
  }
  return s;
}

template <int kMode, int kPad>
__global__ void __launch_bounds__(kThreads) chain(const __grid_constant__ Args<kPad> p) {
  int t = blockIdx.x * kThreads + threadIdx.x;

  // Prologue
  if constexpr ((kMode & kDelay) != 0) {
    uint32_t v = t;
#pragma unroll
    for (int i = 0; i < 60; ++i) asm volatile("mad.lo.u32 %0, %0, 3, 1;" : "+r"(v));
    t += v == 0x12345677u;  // practically never; keeps the chain
  }

  // Prefetch
  if ((kMode & kPrefetch) && t < p.n) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p.x + 2 * t)));
  }

  // Wait for the previous call; let the next one launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  if (!(kMode & kCopy) || t >= p.n) return;

  // Load, combine, store
  const uint4 a = __ldg(p.x + 2 * t), b = __ldg(p.x + 2 * t + 1);
  if constexpr ((kMode & kMath) != 0) {
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t out[4];
    const float s = quantize < (kMode & kRare) != 0 > (w, p.eps, out);
    p.q[t] = make_uint4(out[0], out[1], out[2], out[3]);
    if (t % 8 == 0) p.scale[t / 8] = s;
  } else {
    const uint4 r = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
    p.q[t] = r;
    if ((kMode & kScales) && t % 8 == 0) p.scale[t / 8] = __uint_as_float(r.x & 0x3FFFFFFFu);
  }
}

// Random bf16 in about ±[2^-7, 2^3): every group has a real amax.
__global__ void fill_random(uint16_t* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    h *= 0xC2B2AE3Du;
    h ^= h >> 16;
    const uint32_t exponent = 120 + (h >> 8) % 10;
    x[i] = static_cast<uint16_t>((h & 0x8000u) | (exponent << 7) | (h & 0x7Fu));
  }
}

struct Sets {
  std::vector<void*> x, q, scale;
};

template <int kMode, int kPad = 0>
void launch(cudaStream_t stream, int n, const Sets& sets, int i) {
  Args<kPad> args{};
  args.x = static_cast<const uint4*>(sets.x[i]);
  args.q = static_cast<uint4*>(sets.q[i]);
  args.scale = static_cast<float*>(sets.scale[i]);
  args.n = n;
  args.eps = 1e-10f;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3((n + kThreads - 1) / kThreads);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&config, chain<kMode, kPad>, args));
}

// Median microseconds per call of a graph of about kCallsPerGraph calls cycling through the sets.
float time_chain(cudaStream_t stream, int sets, const std::function<void(int)>& call) {
  const int calls = sets * std::max(1, kCallsPerGraph / sets);
  for (int i = 0; i < 3; ++i) call(i % sets);  // warm up
  CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) call(i % sets);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));  // warm up

  cudaEvent_t start, end;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&end));
  std::vector<float> us;
  for (int r = 0; r < kReplays; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(end, stream));
    CHECK(cudaEventSynchronize(end));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, end));
    us.push_back(ms * 1e3f / calls);
  }
  std::sort(us.begin(), us.end());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(end));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return us[kReplays / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(std::atoi(argv[i]));
  if (ms.empty()) ms = {64, 128, 256, 2048};

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("time per call in us, K = %d, bf16 in, one byte out per element\n", kK);
  std::printf("%6s %5s %5s %7s %7s %7s %7s %7s %7s %7s %7s", "M", "input", "sets", "empty", "copy", "copy+pf",
              "+scales", "+delay", "+math", "+rare", "+param");
#ifdef WITH_FP8QUANT
  std::printf(" | %7s %9s %7s %7s", "row", "row+ue8m0", "mn", "packed");
#endif
  std::printf("\n");
  for (const int m : ms) {
    const int num_groups = kK / kGroupSize, rows = (m + 3) / 4 * 4;
    const size_t x_bytes = size_t(m) * kK * 2, q_bytes = size_t(m) * kK;
    const size_t scale_bytes = size_t(rows) * num_groups * 4;  // the largest layout (TMA-aligned)
    const int n = static_cast<int>(q_bytes / 16);
    for (const bool rotate : {true, false}) {
      const size_t set_bytes = x_bytes + q_bytes + scale_bytes;
      const int count =
          rotate ? static_cast<int>(std::clamp<size_t>((kRotationBytes + set_bytes - 1) / set_bytes, 2, 512)) : 1;
      Sets sets{std::vector<void*>(count), std::vector<void*>(count), std::vector<void*>(count)};
      for (int i = 0; i < count; ++i) {
        CHECK(cudaMalloc(&sets.x[i], x_bytes));
        CHECK(cudaMalloc(&sets.q[i], q_bytes));
        CHECK(cudaMalloc(&sets.scale[i], scale_bytes));
        fill_random<<<256, 256>>>(static_cast<uint16_t*>(sets.x[i]), x_bytes / 2, 1234u + i);
      }
      CHECK(cudaDeviceSynchronize());
      const auto time = [&](auto call) { return time_chain(stream, count, [&](int i) { call(stream, n, sets, i); }); };
      std::printf("%6d %5s %5d %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f", m, rotate ? "DRAM" : "L2", count,
                  time(launch<kEmpty>), time(launch<kCopy>), time(launch < kCopy | kPrefetch >),
                  time(launch < kCopy | kPrefetch | kScales >), time(launch < kCopy | kPrefetch | kScales | kDelay >),
                  time(launch < kCopy | kPrefetch | kMath >), time(launch < kCopy | kPrefetch | kMath | kRare >),
                  time(launch < kCopy | kPrefetch | kMath, 8 >));
#ifdef WITH_FP8QUANT
      const auto quant = [&](fp8quant_scale_layout_t layout, int ue8m0) {
        return time_chain(stream, count, [&](int i) {
          const fp8quant_status_t st = fp8quant_per_token_group_quant(
              sets.x[i], FP8QUANT_DTYPE_BFLOAT16, 1, m, kK, int64_t{m} * kK, kK, sets.q[i], int64_t{m} * kK, kK,
              sets.scale[i], layout, ue8m0, kGroupSize, 1e-10f, stream);
          if (st != FP8QUANT_SUCCESS) {
            std::fprintf(stderr, "fp8quant_per_token_group_quant failed: %s\n", fp8quant_last_error());
            std::exit(1);
          }
        });
      };
      std::printf(" | %7.2f %9.2f %7.2f %7.2f", quant(FP8QUANT_SCALE_ROW, 0), quant(FP8QUANT_SCALE_ROW, 1),
                  quant(FP8QUANT_SCALE_MN, 0), quant(FP8QUANT_SCALE_PACKED_UE8M0, 1));
#endif
      std::printf("\n");
      std::fflush(stdout);
      for (int i = 0; i < count; ++i) {
        CHECK(cudaFree(sets.x[i]));
        CHECK(cudaFree(sets.q[i]));
        CHECK(cudaFree(sets.scale[i]));
      }
    }
  }
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
