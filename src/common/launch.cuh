// Kernel launch with programmatic dependent launch (PDL), shared by every op's launcher.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace fp8quant {

// Launch `kernel(problem)` on `stream`, with `smem` bytes of dynamic shared memory. With `pdl`,
// the launch allows programmatic stream serialization (the kernel may start while the previous
// kernel in the stream finishes; it waits with griddepcontrol.wait before touching memory);
// where the launch refuses the attribute, or without `pdl`, it launches without it. With
// `cooperative`, every block of the grid is resident at once, or the launch fails with
// cudaErrorCooperativeLaunchTooLarge (too many blocks for the GPU, or for the SMs this context
// may use), without a second try. The result is the launch's own status
// (cudaLaunchKernelEx returns it), never an earlier error the caller left for cudaGetLastError; a
// failed launch leaves no error behind.
template <typename Kernel, typename Problem>
cudaError_t launch_with_pdl(Kernel kernel, dim3 grid, dim3 block, cudaStream_t stream, const Problem& problem, bool pdl,
                            size_t smem = 0, bool cooperative = false) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeCooperative;
  attrs[0].val.cooperative = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = cooperative ? attrs : attrs + 1;
  if (pdl) {
    config.numAttrs = cooperative ? 2 : 1;
    const cudaError_t err = cudaLaunchKernelEx(&config, kernel, problem);
    if (err == cudaSuccess) return cudaSuccess;
    cudaGetLastError();                                         // not sticky: clear it and try without the attribute
    if (err == cudaErrorCooperativeLaunchTooLarge) return err;  // so it would be without PDL
  }
  config.numAttrs = cooperative ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, problem);
  if (err != cudaSuccess) cudaGetLastError();  // reported here, not left for the caller (if not sticky)
  return err;
}

// Blocks of kKernel, launched kThreads wide, that one SM holds at once (its occupancy), asked once
// per kernel; where the query fails, the thread limit's count (and the query is asked again).
template <auto kKernel, int kThreads>
int resident_blocks_per_sm() {
  static std::atomic<int> known{0};
  int n = known.load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreads, 0) != cudaSuccess || n < 1) {
    cudaGetLastError();  // the query's own error, not sticky
    return 2048 / kThreads;
  }
  known.store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace fp8quant
