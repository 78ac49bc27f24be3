// The floor under per_token_group_quant's small shapes: chains of trivial kernels launched the
// way the quantizer is (programmatic dependent launch, 256-thread blocks, 32 bytes of input and
// 16 of output per thread), timed per call in a CUDA graph like `python -m fp8quant bench`.
//
//   empty       griddepcontrol.wait and launch_dependents, nothing else: launch and dependency cost
//   copy        + load 32 bytes, store 16 (the quantizer's traffic at bf16, without its arithmetic)
//   copy+pf     + an L2 prefetch of the thread's input before the wait, as the quantizer's first
//               wave does (every block here; up to M = 256 the whole grid is the first wave)
//   +scales     + one 4-byte store per eight threads (fp32 row-layout scales at group size 128)
//
// Each shape is M rows of K = 7168 bf16 (M * 7168 / 16 threads), first with buffers rotated
// through 256 MiB (input in DRAM), then with one buffer set (input in L2).
//
// Build: nvcc -O3 -arch=sm_90a -o copy_floor benchmarks/copy_floor.cu
// Run:   ./copy_floor [M ...]        (default: 64 128 256 2048)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(expr)                                                                 \
  do {                                                                              \
    const cudaError_t err_ = (expr);                                                \
    if (err_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(err_));     \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

namespace {

constexpr int kK = 7168;
constexpr int kThreads = 256;
constexpr size_t kRotationBytes = size_t{256} << 20;
constexpr int kCallsPerGraph = 1000;
constexpr int kReplays = 10;

enum Mode : int { kEmpty = 0, kCopy = 1, kPrefetch = 2, kScales = 4 };

template <int kMode>
__global__ void __launch_bounds__(kThreads) chain(const uint4* __restrict__ x, uint4* __restrict__ q,
                                                  float* __restrict__ scale, int n) {
  const int t = blockIdx.x * kThreads + threadIdx.x;

  // Prefetch
  if ((kMode & kPrefetch) && t < n) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(x + 2 * t)));
  }

  // Wait for the previous call; let the next one launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  if (!(kMode & kCopy) || t >= n) return;

  // Load, combine, store
  const uint4 a = __ldg(x + 2 * t), b = __ldg(x + 2 * t + 1);
  const uint4 r = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
  q[t] = r;
  if ((kMode & kScales) && t % 8 == 0) scale[t / 8] = __uint_as_float(r.x & 0x3FFFFFFFu);
}

template <int kMode>
void launch(cudaStream_t stream, int n, const void* x, void* q, void* scale) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3((n + kThreads - 1) / kThreads);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&config, chain<kMode>, static_cast<const uint4*>(x), static_cast<uint4*>(q),
                           static_cast<float*>(scale), n));
}

// Median microseconds per call of a graph of kCallsPerGraph calls cycling through the sets.
template <int kMode>
float time_chain(cudaStream_t stream, int n, const std::vector<void*>& xs, const std::vector<void*>& qs,
                 const std::vector<void*>& scales) {
  const int sets = static_cast<int>(xs.size());
  const int calls = sets * std::max(1, kCallsPerGraph / sets);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) launch<kMode>(stream, n, xs[i % sets], qs[i % sets], scales[i % sets]);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, stream));  // warm up

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
  std::printf("%6s %5s %5s %8s %8s %8s %8s\n", "M", "input", "sets", "empty", "copy", "copy+pf", "+scales");
  for (const int m : ms) {
    const size_t x_bytes = size_t(m) * kK * 2, q_bytes = size_t(m) * kK, scale_bytes = q_bytes / 32;
    const int n = static_cast<int>(q_bytes / 16);
    for (const bool rotate : {true, false}) {
      const size_t set_bytes = x_bytes + q_bytes + scale_bytes;
      const int sets = rotate ? static_cast<int>(std::clamp<size_t>((kRotationBytes + set_bytes - 1) / set_bytes, 2, 512)) : 1;
      std::vector<void*> xs(sets), qs(sets), scales(sets);
      for (int i = 0; i < sets; ++i) {
        CHECK(cudaMalloc(&xs[i], x_bytes));
        CHECK(cudaMalloc(&qs[i], q_bytes));
        CHECK(cudaMalloc(&scales[i], scale_bytes));
        CHECK(cudaMemset(xs[i], 0x3C, x_bytes));
      }
      std::printf("%6d %5s %5d %8.2f %8.2f %8.2f %8.2f\n", m, rotate ? "DRAM" : "L2", sets,
                  time_chain<kEmpty>(stream, n, xs, qs, scales), time_chain<kCopy>(stream, n, xs, qs, scales),
                  time_chain<kCopy | kPrefetch>(stream, n, xs, qs, scales),
                  time_chain<kCopy | kPrefetch | kScales>(stream, n, xs, qs, scales));
      std::fflush(stdout);
      for (int i = 0; i < sets; ++i) {
        CHECK(cudaFree(xs[i]));
        CHECK(cudaFree(qs[i]));
        CHECK(cudaFree(scales[i]));
      }
    }
  }
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
