// One thread's 16-element slice of a quantization group, shared by the kernels that quantize
// rows in groups (per_token_group_quant.cuh, rms_norm.cuh): loading, widening, the MoE sources'
// element-wise steps, and the group's amax, scale and e4m3 bytes (SPEC 1) from the device
// toolkit's vector, team reduction and group-quantize core (src/common).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/math.cuh"
#include "common/quantize.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace fp8quant::kernels {

constexpr int kElemsPerThread = 16;

// One thread's 16 elements as loaded: 32-bit words, low element first.
template <typename T>
struct Slice {
  static constexpr int kWords = kElemsPerThread * sizeof(T) / sizeof(uint32_t);
  uint32_t w[kWords];
};

// Load 16 consecutive elements: 16-byte loads (kCache) when aligned, else element by element.
template <typename T, bool kAligned, Cache kCache = Cache::kReadOnly>
__device__ __forceinline__ void load_slice(const T* src, Slice<T>& s) {
  if constexpr (kAligned) {
    load_words<Slice<T>::kWords, kCache>(src, s.w);
  } else if constexpr (sizeof(T) == 2) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
    for (int i = 0; i < Slice<T>::kWords; ++i) s.w[i] = h[2 * i] | (static_cast<uint32_t>(h[2 * i + 1]) << 16);
  } else {
#pragma unroll
    for (int i = 0; i < Slice<T>::kWords; ++i) s.w[i] = reinterpret_cast<const uint32_t*>(src)[i];
  }
}

// Widen a slice to floats.
template <typename T>
__device__ __forceinline__ void unpack_slice(const Slice<T>& s, float (&v)[kElemsPerThread]) {
#pragma unroll
  for (int i = 0; i < kElemsPerThread / 2; ++i) {
    float2 f;
    if constexpr (sizeof(T) == 4) {
      f = make_float2(__uint_as_float(s.w[2 * i]), __uint_as_float(s.w[2 * i + 1]));
    } else {
      f = math::unpack2(s.w[i], T{});
    }
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// Ask L2 to fetch the bytes of the slice at src.
template <typename T, bool kAligned>
__device__ __forceinline__ void prefetch_slice(const T* src) {
  constexpr int kBytes = kElemsPerThread * sizeof(T);
  const char* bytes = reinterpret_cast<const char*>(src);
#pragma unroll
  for (int offset = 0; offset < kBytes; offset += 32) {  // one 32-byte sector each
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(bytes + offset)));
  }
  if constexpr (!kAligned) {  // an unaligned slice reaches into one more sector
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(bytes + kBytes - 1)));
  }
}

// silu(gate) * up of two slices, element by element, into `gate` (as T: the pipeline after the
// load sees x's dtype). 16-bit T take silu_mul2's fast path, in one of two forms:
//   pair by pair   each pair's exact path, where needed, right after its fast path: a branch a
//                  pair, so the pairs' dependent chains run one after another;
//   kFixupsLast    every pair's fast path first, straight-line (the chains interleave), then
//                  the exact path of each element the fast path leaves, each lane its lowest one
//                  at a time, the lanes that have one together. Shorter at the latency a lone
//                  warp sees; more registers (docs/benchmarks-history.md, twenty-eighth run).
template <typename T, bool kFixupsLast>
__device__ __forceinline__ void silu_mul_slice(Slice<T>& gate, const Slice<T>& up) {
  constexpr int kWords = Slice<T>::kWords;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      gate.w[i] = __float_as_uint(math::silu_mul<T>(__uint_as_float(gate.w[i]), __uint_as_float(up.w[i])));
    }
  } else if constexpr (kFixupsLast) {
    // Fast path
    uint32_t silu[kWords], inexact = 0u;  // bit 2i + h: element h of pair i
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const float2 g = math::unpack2(gate.w[i], T{});
      const math::SiluFast f = math::silu_fast2(g);
      silu[i] = math::pack2(f.a - f.da, f.b - f.db, T{});
      const uint32_t differ = silu[i] ^ math::pack2(f.a + f.da, f.b + f.db, T{});  // no branches: one block
      inexact |= static_cast<uint32_t>(!(fabsf(g.x) <= math::kSiluFastMaxAbs) | ((differ & 0xFFFFu) != 0u)) << (2 * i);
      inexact |= static_cast<uint32_t>(!(fabsf(g.y) <= math::kSiluFastMaxAbs) | ((differ >> 16) != 0u)) << (2 * i + 1);
    }
    // Exact path: each lane its lowest inexact element at a time
    while (inexact != 0u) {
      const int k = __ffs(inexact) - 1, pair = k / 2, shift = 16 * (k % 2);
      uint32_t g = gate.w[0], s = silu[0];
#pragma unroll
      for (int i = 1; i < kWords; ++i) {
        g = i == pair ? gate.w[i] : g;
        s = i == pair ? silu[i] : s;
      }
      const float exact = math::silu_exact(math::unpack2(g >> shift, T{}).x);
      const uint32_t mask = 0xFFFFu << shift;
      s = (s & ~mask) | (math::pack2(exact, exact, T{}) & mask);
#pragma unroll
      for (int i = 0; i < kWords; ++i) silu[i] = i == pair ? s : silu[i];
      inexact &= inexact - 1u;
    }
#pragma unroll
    for (int i = 0; i < kWords; ++i) gate.w[i] = math::mul2(silu[i], up.w[i], T{});
  } else {
#pragma unroll
    for (int i = 0; i < kWords; ++i) gate.w[i] = math::silu_mul2<T>(gate.w[i], up.w[i]);
  }
}

// A team's slice at src (loaded with kCache), or zeros when it is not `live`; with kSiluMul,
// silu(gate) * up of it and of the slice up_offset elements on, in x's dtype (the MoE sources), in
// silu_mul_slice's kFixupsLast form (every lane of the warp calls it then) or pair by pair.
template <typename T, bool kAligned, bool kSiluMul, Cache kCache = Cache::kReadOnly, bool kFixupsLast = false>
__device__ __forceinline__ Slice<T> load_group_slice(const T* src, int64_t up_offset, bool live) {
  Slice<T> slice, up;
  if (live) {
    load_slice<T, kAligned, kCache>(src, slice);
    if constexpr (kSiluMul) {
      load_slice<T, kAligned>(src + up_offset, up);
      // Pair by pair: the pairs' branches start new blocks, so up's loads stay beside gate's
      if constexpr (!kFixupsLast) silu_mul_slice<T, false>(slice, up);
    }
  } else {
#pragma unroll
    for (int i = 0; i < Slice<T>::kWords; ++i) slice.w[i] = 0u;
    if constexpr (kFixupsLast) up = slice;
  }
  // The straight-line form in a block of its own, which every warp here enters (it holds a live
  // lane): in the loads' block ptxas issues up's loads only after the fast path, a second memory
  // round trip
  if constexpr (kSiluMul && kFixupsLast) {
    if (__any_sync(kFullMask, live)) silu_mul_slice<T, true>(slice, up);
  }
  return slice;
}

// A slice quantized: its four words of e4m3 bytes (low element first), the group's scale s
// and, with UE8M0 scales, s's byte e.
template <bool kUE8M0>
struct QuantizedSlice {
  uint32_t q[kElemsPerThread / 4];
  float s;
  uint32_t e;
};

// The amax of the group a team of kTeam lanes holds, over its finite elements: NaN is dropped,
// and a group holding ±inf (rare; has_inf) is reduced again without them. v gets the slice
// widened. Every lane of the warp calls it.
template <typename T, int kTeam>
__device__ __forceinline__ float team_finite_amax(const Slice<T>& slice, float (&v)[kElemsPerThread], bool& has_inf) {
  float amax = warp_reduce<kTeam>(math::abs_max<T>(slice.w), MaxOp{});
  unpack_slice(slice, v);
  has_inf = amax == INFINITY;
  if (__any_sync(kFullMask, has_inf)) amax = warp_reduce<kTeam>(finite_abs_max(v), MaxOp{});
  return amax;
}

// Quantize the slice of each lane, a team of kTeam lanes holding one group (every lane of the
// warp calls it).
template <typename T, int kTeam, bool kUE8M0>
__device__ __forceinline__ QuantizedSlice<kUE8M0> quantize_slice(const Slice<T>& slice, float eps) {
  // Reduce amax
  float v[kElemsPerThread];
  bool has_inf;
  const float amax = fmaxf(team_finite_amax<T, kTeam>(slice, v, has_inf), eps);

  // Scale
  const GroupScale<kUE8M0> scale = group_scale<kUE8M0>(amax);

  // Quantize
  QuantizedSlice<kUE8M0> result;
  const auto quantize = [&](auto&& divide) {
#pragma unroll
    for (int i = 0; i < kElemsPerThread / 4; ++i) result.q[i] = quantize4(divide, &v[4 * i]);
  };
  math::with_divide<kUE8M0>(scale.s, scale.e, has_inf, quantize);

  result.s = scale.s;
  result.e = scale.e;
  return result;
}

// MXFP8: quantize the slice of each lane with its group's E8M0 scale (docs/contract.md, "MXFP8";
// no epsilon: an all-zero group gets byte 0), the recipe RCEIL or, with kFloor, FLOOR. Returns
// the e4m3 words and the byte e; the division by 2^(e - 127) is a multiply by its exact
// reciprocal. Every lane of the warp calls it.
template <typename T, int kTeam, bool kFloor>
__device__ __forceinline__ QuantizedSlice<true> quantize_slice_e8m0(const Slice<T>& slice) {
  // Reduce amax
  float v[kElemsPerThread];
  bool has_inf;
  const float amax = team_finite_amax<T, kTeam>(slice, v, has_inf);

  // Scale byte
  QuantizedSlice<true> result;
  result.e = kFloor ? e8m0_floor(amax) : e8m0_rceil(amax);
  result.s = 0.0f;  // unused: MXFP8 stores the byte

  // Quantize
  const float inv = math::ue8m0_reciprocal(result.e);
  const auto divide = [inv](float x) { return x * inv; };
#pragma unroll
  for (int i = 0; i < kElemsPerThread / 4; ++i) result.q[i] = quantize4(divide, &v[4 * i]);
  return result;
}

// A slice quantized to NVFP4: its 16 e2m1 codes, eight to a word (element 2i in the low nibble
// of byte i), and its group's e4m3 scale byte.
struct Fp4Slice {
  uint32_t q[kElemsPerThread / 8];
  uint32_t s;
};

// NVFP4's group amax (a group per lane): over the finite elements, v the slice widened; *finite
// when every element is finite, the case encode_nvfp4 converts fastest.
template <typename T>
__device__ __forceinline__ float lane_finite_amax(const Slice<T>& slice, float (&v)[kElemsPerThread], bool* finite) {
  unpack_slice(slice, v);
  const float amax = math::abs_max_if_finite<T>(slice.w, finite);
  return *finite ? amax : finite_abs_max(v);  // a NaN or an infinity: rare
}

// NVFP4 (docs/contract.md, "NVFP4"): encode a slice of one group of 16 (its words, and v widened)
// whose finite amax is `amax` with the encode scale `global_scale`: s = e4m3(RN(RN(amax / 6) * S)),
// elements e2m1(RN(x * RN(S / s))) (0 when s is 0), every division rounded as IEEE's. With every
// element finite (`finite`) and every product below 7 (RN(amax * factor) < 7, false for a NaN
// factor) the elements take e2m1x8_product, else e2m1x2 element by element (saturation, NaN to
// +6, and inf * 0).
template <typename T>
__device__ __forceinline__ Fp4Slice encode_nvfp4(const Slice<T>& slice, const float (&v)[kElemsPerThread], float amax,
                                                 bool finite, float global_scale) {
  // Scale
  Fp4Slice result;
  result.s = math::cvt_e4m3(__fmul_rn(math::fp4_scale_from_amax(amax), global_scale));
  const float s = math::e4m3_to_float(result.s);
  const float factor = s != 0.0f ? math::fp4_factor(global_scale, s) : 0.0f;  // 0: every element 0

  // Quantize
  constexpr int kWordsPer8 = Slice<T>::kWords / 2;  // the words of eight elements
  if (finite && __fmul_rn(amax, factor) < 7.0f) {
#pragma unroll
    for (int w = 0; w < kElemsPerThread / 8; ++w) {
      result.q[w] = math::e2m1x8_product(&v[8 * w], factor, math::e2m1_signs<T>(&slice.w[kWordsPer8 * w]));
    }
  } else {
#pragma unroll
    for (int w = 0; w < kElemsPerThread / 8; ++w) {
      uint32_t word = 0u;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        word |= math::e2m1x2(__fmul_rn(v[8 * w + 2 * j], factor), __fmul_rn(v[8 * w + 2 * j + 1], factor)) << (8 * j);
      }
      result.q[w] = word;
    }
  }
  return result;
}

// NVFP4: quantize the slice of each lane, one group of 16, with the encode scale `global_scale`
// (encode_nvfp4). Lanes need not call it together.
template <typename T>
__device__ __forceinline__ Fp4Slice quantize_slice_nvfp4(const Slice<T>& slice, float global_scale) {
  float v[kElemsPerThread];
  bool finite;
  const float amax = lane_finite_amax<T>(slice, v, &finite);
  return encode_nvfp4<T>(slice, v, amax, finite, global_scale);
}

}  // namespace fp8quant::kernels
