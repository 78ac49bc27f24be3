// Host definitions under which the kernels' device code compiles as plain C++ (run.sh): CUDA's
// qualifiers emptied, shared memory static (the emulator runs one block at a time), a block's
// threads as std::threads meeting at a std::barrier for __syncthreads, and the intrinsics the
// block-scaled kernels use in IEEE float32 (g++ with -ffp-contract=off: no fused operations but
// the FMAs the code asks for). run.sh turns the PTX statements that produce nothing (PDL's waits,
// L2 prefetches) into EMU_ASM, a no-op, before this header is read; any other inline PTX that an
// emulated path reaches fails to assemble.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#undef __shared__
#define __shared__ static
#undef __forceinline__
#define __forceinline__ inline
#undef __noinline__
#define __noinline__ __attribute__((noinline))
#undef __device__
#define __device__
#undef __global__
#define __global__
#undef __launch_bounds__
#define __launch_bounds__(...)
#define __grid_constant__
#define EMU_ASM(...) ((void)0)

// Launch geometry: each emulated thread's own index, the launch's sizes
struct EmuDim {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmuDim threadIdx, blockIdx;
inline EmuDim gridDim, blockDim;
inline std::barrier<>* emu_barrier = nullptr;  // the running block's
inline void __syncthreads() { emu_barrier->arrive_and_wait(); }

// Integer and bit intrinsics
template <class T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) * b) >> 32); }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t bytes = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (s >> (4 * i)) & 0xF;
    uint32_t byte = (bytes >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0;  // sign replication
    r |= byte << (8 * i);
  }
  return r;
}
inline uint32_t __vmaxu2(uint32_t a, uint32_t b) {
  return std::max(a & 0xFFFFu, b & 0xFFFFu) | (std::max(a >> 16, b >> 16) << 16);
}
inline int __ffs(int x) { return x ? __builtin_ctz(x) + 1 : 0; }

// Float32 arithmetic, rounded to nearest even
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
// SiLU's fast path, more accurate than the hardware's (inside the bounds silu_mul2 assumes);
// run.sh turns expf_fast_normal's ex2.approx into emu_ex2_approx, rcp_rn's rcp.approx into
// emu_rcp_approx
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float a) { return std::exp(a); }
inline float emu_ex2_approx(float a) { return std::exp2(a); }
// rcp_rn's approximate reciprocal, which its Newton step then rounds: here already RN(1 / a)
inline float emu_rcp_approx(float a) { return 1.0f / a; }

// Memory
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T __ldcs(const T* p) {
  return *p;
}
template <class T>
inline void __stcs(T* p, T v) {
  *p = v;
}
inline const void* __cvta_generic_to_global(const void* p) { return p; }

// Warp collectives: each lane posts its value, the warp meets, each reads what it needs, the warp
// meets again (every lane of the warp calls them in the same order, as kFullMask requires). The
// running block's warps: emu_warps[threadIdx.x / 32].
struct EmuWarp {
  std::barrier<> meet{32};
  uint32_t posted[32];
};
inline EmuWarp* emu_warps = nullptr;
template <class Pick>
inline uint32_t emu_exchange(uint32_t mine, Pick pick) {
  EmuWarp& warp = emu_warps[threadIdx.x / 32];
  const int lane = threadIdx.x % 32;
  warp.posted[lane] = mine;
  warp.meet.arrive_and_wait();
  const uint32_t got = pick(warp.posted, lane);
  warp.meet.arrive_and_wait();
  return got;
}
template <class T>
inline uint32_t emu_bits(T v) {
  static_assert(sizeof(T) == 4, "32-bit values");
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
template <class T>
inline T emu_from_bits(uint32_t u) {
  T v;
  std::memcpy(&v, &u, 4);
  return v;
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  return emu_exchange(pred, [](const uint32_t* v, int) {
    uint32_t bits = 0;
    for (int i = 0; i < 32; ++i) bits |= (v[i] != 0) << i;
    return bits;
  });
}
inline bool __all_sync(unsigned mask, bool pred) { return __ballot_sync(mask, pred) == 0xFFFFFFFFu; }
inline bool __any_sync(unsigned mask, bool pred) { return __ballot_sync(mask, pred) != 0; }
template <class T>
inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  return emu_from_bits<T>(
      emu_exchange(emu_bits(v), [&](const uint32_t* p, int lane) { return p[(lane & ~(width - 1)) + src % width]; }));
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  return emu_from_bits<T>(emu_exchange(emu_bits(v), [&](const uint32_t* p, int lane) {
    const int other = lane ^ lane_mask;
    return p[(other & ~(width - 1)) == (lane & ~(width - 1)) ? other : lane];
  }));
}

// Launch `kernel(problem)` on a grid_x x grid_y grid of `threads`-thread blocks: one std::thread a
// block thread, running the blocks in turn (each meets the others at the block's end), so that
// __syncthreads and the warps' collectives work and shared memory serves one block at a time.
template <class Kernel, class Problem>
void emu_launch(Kernel kernel, const Problem& problem, unsigned grid_x, unsigned grid_y, unsigned threads) {
  gridDim = {grid_x, grid_y, 1};
  blockDim = {threads, 1, 1};
  std::barrier<> block_barrier(threads), block_end(threads);
  std::vector<EmuWarp> warps(threads / 32);
  emu_barrier = &block_barrier;
  emu_warps = warps.data();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      threadIdx = {t, 0, 0};
      for (unsigned by = 0; by < grid_y; ++by) {
        for (unsigned bx = 0; bx < grid_x; ++bx) {
          blockIdx = {bx, by, 0};
          kernel(problem);
          block_end.arrive_and_wait();
        }
      }
    });
  }
  for (auto& thread : pool) thread.join();
}
