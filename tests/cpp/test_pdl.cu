// Programmatic dependent launch: a producer kernel lets the next kernel launch at once, then
// writes x late. fp8quant, launched next in the stream, must see the final x: on a stream and
// in a CUDA graph, with PDL on and off (fp8quant_set_pdl). A control kernel that reads x without
// waiting shows that the window is real (it sees the stale x), so the test can fail; the graph
// captured with PDL on must hold a programmatic edge, and with PDL off a plain one.
// Needs a supported GPU; exits 77 (skipped) without one.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "expect.hpp"
#include "fp8quant/fp8quant.h"
#include "gpu.hpp"

namespace {

#define CHECK_CUDA(expr)                                                                            \
  do {                                                                                              \
    const cudaError_t err_ = (expr);                                                                \
    if (err_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

constexpr int64_t kM = 1024, kK = 7168, kN = kM * kK;
constexpr int kProducerBlocks = 4;
constexpr uint64_t kDelayNs = 200'000;  // the producer writes x this long after it lets the next kernel launch

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Lets the next kernel launch at once, waits, then copies src into x.
__global__ void late_producer(uint16_t* x, const uint16_t* src, int64_t n) {
  asm volatile("griddepcontrol.launch_dependents;");
  const uint64_t start = global_ns();
  while (global_ns() - start < kDelayNs) {
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = src[i];
  }
}

// The control: reads x without waiting for the producer (no griddepcontrol.wait).
__global__ void copy_without_wait(const uint16_t* x, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = x[i];
  }
}

struct Buffers {
  uint16_t *x, *stale, *final_x, *copy;
  uint8_t* q;
  float* scale;
  size_t scale_bytes;
};

void quantize(const Buffers& b, cudaStream_t stream) {
  const fp8quant_status_t st =
      fp8quant_per_token_group_quant(b.x, FP8QUANT_DTYPE_BFLOAT16, 1, kM, kK, 0, kK, b.q, 0, kK, b.scale,
                                     FP8QUANT_SCALE_MN_TMA, 0, 128, 1e-4f, stream);
  if (st != FP8QUANT_SUCCESS) {
    std::fprintf(stderr, "quantize: %s: %s\n", fp8quant_status_string(st), fp8quant_last_error());
    std::exit(1);
  }
}

// q and scales as bytes, after the stream is done.
std::vector<uint8_t> outputs(const Buffers& b) {
  std::vector<uint8_t> out(kN + b.scale_bytes);
  CHECK_CUDA(cudaMemcpy(out.data(), b.q, kN, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(out.data() + kN, b.scale, b.scale_bytes, cudaMemcpyDeviceToHost));
  return out;
}

void poison(const Buffers& b) {
  CHECK_CUDA(cudaMemset(b.q, 0xA5, kN));
  CHECK_CUDA(cudaMemset(b.scale, 0xFF, b.scale_bytes));
}

// x holds the stale values again.
void reset_x(const Buffers& b) {
  CHECK_CUDA(cudaMemcpy(b.x, b.stale, kN * 2, cudaMemcpyDeviceToDevice));
  CHECK_CUDA(cudaDeviceSynchronize());
}

// The producer, then `next` on the same stream.
template <typename Next>
void produce_then(const Buffers& b, cudaStream_t stream, Next next) {
  late_producer<<<kProducerBlocks, 256, 0, stream>>>(b.x, b.final_x, kN);
  CHECK_CUDA(cudaGetLastError());
  next();
}

// Kind of the one edge between the two kernel nodes of a captured graph.
int edge_type(cudaGraph_t graph) {
  size_t n = 0;
#if CUDART_VERSION >= 13000
  CHECK_CUDA(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
#else
  CHECK_CUDA(cudaGraphGetEdges_v2(graph, nullptr, nullptr, nullptr, &n));
#endif
  if (n != 1) return -1;
  cudaGraphNode_t from, to;
  cudaGraphEdgeData data{};
#if CUDART_VERSION >= 13000
  CHECK_CUDA(cudaGraphGetEdges(graph, &from, &to, &data, &n));
#else
  CHECK_CUDA(cudaGraphGetEdges_v2(graph, &from, &to, &data, &n));
#endif
  return data.type;
}

// Random bf16 values of varied magnitude, never zero.
std::vector<uint16_t> random_bf16(uint32_t seed) {
  std::vector<uint16_t> v(kN);
  uint32_t s = seed;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    const uint16_t exponent = 100 + (s >> 24) % 50;  // 2^-27 .. 2^22
    e = static_cast<uint16_t>(((s >> 8) & 0x8000u) | (exponent << 7) | ((s >> 9) & 0x7Fu));
  }
  return v;
}

}  // namespace

int main() {
  int major = 0, minor = 0;
  if (fp8quant_check_device(&major, &minor) != FP8QUANT_SUCCESS) {
    std::printf("skipped: %s\n", fp8quant_last_error());
    return kSkipped;
  }
  Buffers b{};
  fp8quant_scale_shape_t shape{};
  fp8quant_scale_shape(FP8QUANT_SCALE_MN_TMA, 1, kM, kK / 128, &shape);
  b.scale_bytes = shape.numel * 4;
  CHECK_CUDA(cudaMalloc(&b.x, kN * 2));
  CHECK_CUDA(cudaMalloc(&b.stale, kN * 2));
  CHECK_CUDA(cudaMalloc(&b.final_x, kN * 2));
  CHECK_CUDA(cudaMalloc(&b.copy, kN * 2));
  CHECK_CUDA(cudaMalloc(&b.q, kN));
  CHECK_CUDA(cudaMalloc(&b.scale, b.scale_bytes));
  const std::vector<uint16_t> stale = random_bf16(1), final_x = random_bf16(2);
  CHECK_CUDA(cudaMemcpy(b.stale, stale.data(), kN * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b.final_x, final_x.data(), kN * 2, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // What fp8quant gives for the final and for the stale x, with no producer in flight
  CHECK_CUDA(cudaMemcpy(b.x, b.final_x, kN * 2, cudaMemcpyDeviceToDevice));
  quantize(b, stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const std::vector<uint8_t> want = outputs(b);
  reset_x(b);
  quantize(b, stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  EXPECT(outputs(b) != want);  // the two inputs are told apart

  // Control: a kernel launched with PDL that skips the wait sees the stale x. It runs once
  // first, so that loading its module (lazy loading waits for running kernels) is not timed.
  copy_without_wait<<<1, 32, 0, stream>>>(b.final_x, b.copy, 1);
  late_producer<<<1, 32, 0, stream>>>(b.copy, b.final_x, 1);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  reset_x(b);
  produce_then(b, stream, [&] {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(132);
    config.blockDim = dim3(256);
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
    CHECK_CUDA(cudaLaunchKernelEx(&config, copy_without_wait, static_cast<const uint16_t*>(b.x), b.copy, kN));
  });
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<uint16_t> seen(kN);
  CHECK_CUDA(cudaMemcpy(seen.data(), b.copy, kN * 2, cudaMemcpyDeviceToHost));
  int64_t stale_seen = 0;
  for (int64_t i = 0; i < kN; ++i) stale_seen += seen[i] == stale[i] && stale[i] != final_x[i];
  if (seen != stale) {
    std::fprintf(stderr,
                 "the control kernel read only %lld of %lld elements before the producer wrote them: "
                 "this test could not catch a missing wait\n",
                 static_cast<long long>(stale_seen), static_cast<long long>(kN));
    ++failures;
  }

  for (const int pdl : {1, 0}) {
    fp8quant_set_pdl(pdl);

    // On a stream
    reset_x(b);
    poison(b);
    produce_then(b, stream, [&] { quantize(b, stream); });
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (outputs(b) != want) {
      std::fprintf(stderr, "PDL %s, stream: fp8quant did not see the producer's final x\n", pdl ? "on" : "off");
      ++failures;
    }

    // In a graph: the edge is programmatic with PDL on, plain with it off
    cudaGraph_t graph;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    produce_then(b, stream, [&] { quantize(b, stream); });
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    const int type = edge_type(graph);
    if (type != (pdl ? cudaGraphDependencyTypeProgrammatic : cudaGraphDependencyTypeDefault)) {
      std::fprintf(stderr, "PDL %s: the captured edge has type %d\n", pdl ? "on" : "off", type);
      ++failures;
    }
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      reset_x(b);
      poison(b);
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (outputs(b) != want) {
        std::fprintf(stderr, "PDL %s, graph replay %d: fp8quant did not see the final x\n", pdl ? "on" : "off", replay);
        ++failures;
      }
    }
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  fp8quant_set_pdl(1);

  CHECK_CUDA(cudaStreamDestroy(stream));
  for (void* p : {static_cast<void*>(b.x), static_cast<void*>(b.stale), static_cast<void*>(b.final_x),
                  static_cast<void*>(b.copy), static_cast<void*>(b.q), static_cast<void*>(b.scale)}) {
    CHECK_CUDA(cudaFree(p));
  }
  if (failures) return 1;
  std::printf("PDL checks passed on compute capability %d.%d (stream and graph, PDL on and off)\n", major, minor);
  return 0;
}
