// The vector every kernel moves global memory with: kBytes (4, 8 or 16) bytes as 32-bit words,
// low bytes first, loaded and stored in one aligned access each.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp8quant {

// How an access treats the caches.
enum class Cache {
  kDefault,    // ld.global / st.global
  kReadOnly,   // ld.global.nc: data no thread of the kernel writes (inputs)
  kStreaming,  // ld.global.cs / st.global.cs: evict first, for data used once
  kEvictLast,  // st.global with an L2 evict-last policy (4-byte stores): small outputs whose
               // sectors scattered stores complete one word at a time while streams pass by
};

template <int kBytes>
struct Vec {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "one aligned access: 4, 8 or 16 bytes");
  static constexpr int kWords = kBytes / 4;
  uint32_t w[kWords];

  // Load from `src`, aligned to kBytes.
  template <Cache kCache = Cache::kReadOnly>
  __device__ __forceinline__ static Vec load(const void* src) {
    Vec v;
    if constexpr (kBytes == 16) {
      const uint4 r = access<kCache>(static_cast<const uint4*>(src));
      v.w[0] = r.x, v.w[1] = r.y, v.w[2] = r.z, v.w[3] = r.w;
    } else if constexpr (kBytes == 8) {
      const uint2 r = access<kCache>(static_cast<const uint2*>(src));
      v.w[0] = r.x, v.w[1] = r.y;
    } else {
      v.w[0] = access<kCache>(static_cast<const uint32_t*>(src));
    }
    return v;
  }

  // Store to `dst`, aligned to kBytes.
  template <Cache kCache = Cache::kDefault>
  __device__ __forceinline__ void store(void* dst) const {
    if constexpr (kBytes == 16) {
      put<kCache>(static_cast<uint4*>(dst), make_uint4(w[0], w[1], w[2], w[3]));
    } else if constexpr (kBytes == 8) {
      put<kCache>(static_cast<uint2*>(dst), make_uint2(w[0], w[1]));
    } else {
      put<kCache>(static_cast<uint32_t*>(dst), w[0]);
    }
  }

 private:
  template <Cache kCache, typename V>
  __device__ __forceinline__ static V access(const V* p) {
    if constexpr (kCache == Cache::kReadOnly) return __ldg(p);
    if constexpr (kCache == Cache::kStreaming) return __ldcs(p);
    if constexpr (kCache == Cache::kDefault) return *p;
  }

  template <Cache kCache, typename V>
  __device__ __forceinline__ static void put(V* p, V v) {
    static_assert(kCache != Cache::kReadOnly, "stores have no read-only form");
    if constexpr (kCache == Cache::kStreaming) {
      __stcs(p, v);
    } else if constexpr (kCache == Cache::kEvictLast) {
      static_assert(sizeof(V) == 4, "evict-last stores are 4 bytes");
      uint64_t policy;
      asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
      asm volatile("st.global.L2::cache_hint.b32 [%0], %1, %2;" ::"l"(p), "r"(v), "l"(policy) : "memory");
    } else {
      *p = v;
    }
  }
};

// kWords words (a multiple of four) from `src` in 16-byte loads, aligned to 16 bytes.
template <int kWords, Cache kCache = Cache::kReadOnly>
__device__ __forceinline__ void load_words(const void* src, uint32_t (&w)[kWords]) {
  static_assert(kWords % 4 == 0, "whole 16-byte vectors");
#pragma unroll
  for (int i = 0; i < kWords / 4; ++i) {
    const Vec<16> v = Vec<16>::load<kCache>(static_cast<const uint4*>(src) + i);
#pragma unroll
    for (int j = 0; j < 4; ++j) w[4 * i + j] = v.w[j];
  }
}

// kWords words (a multiple of four) to `dst` in 16-byte stores, aligned to 16 bytes.
template <int kWords, Cache kCache = Cache::kDefault>
__device__ __forceinline__ void store_words(void* dst, const uint32_t (&w)[kWords]) {
  static_assert(kWords % 4 == 0, "whole 16-byte vectors");
#pragma unroll
  for (int i = 0; i < kWords / 4; ++i) {
    Vec<16> v;
#pragma unroll
    for (int j = 0; j < 4; ++j) v.w[j] = w[4 * i + j];
    v.store<kCache>(static_cast<uint4*>(dst) + i);
  }
}

}  // namespace fp8quant
