// Device-side numerics shared by every quantization kernel (SPEC.md section 1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <type_traits>

// Blackwell's family and arch-specific targets (sm_100f, sm_100a) convert floats to e2m1 and
// to UE8M0 in hardware (cvt ... e2m1x2, cvt ... ue8m0x2); sm_90a has neither instruction and
// takes the bit-pattern conversions below, which give the same bytes.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 && \
    (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) || defined(__CUDA_ARCH_SPECIFIC__))
#define FP8QUANT_HW_BLOCK_SCALED_CVT 1
#else
#define FP8QUANT_HW_BLOCK_SCALED_CVT 0
#endif

namespace fp8quant::math {

constexpr float kFp8Max = 448.0f;

// Scales at or above this take the fast exact division below; see div_rn_with_rcp.
constexpr float kFastDivMinScale = 0x1p-90f;

// x / s rounded to nearest (IEEE), given r = RN(1 / s).
//
// One multiply and two FMAs instead of the compiler's per-division reciprocal, refinement and
// range check (Markstein's correction: the remainder x - q*s is exact in an FMA, and q + rem*r
// rounds to RN(x/s); the compiler's own fast path has the same shape with a less accurate r).
// The remainder is formed negated, -(q*s - x), so that an exact quotient adds -0 and a zero x
// keeps its sign. Valid for NaN x and finite x with |x/s| < 2^126 when s >= kFastDivMinScale: the
// remainder then never drops into subnormals for quotients that e4m3 can tell apart
// (|x/s| >= 2^-11), and smaller quotients round to a zero of x's sign either way. Infinite x
// needs IEEE division (inf - inf).
__device__ __forceinline__ float div_rn_with_rcp(float x, float s, float r) {
  const float q = __fmul_rn(x, r);
  const float neg_rem = __fmaf_rn(q, s, -x);
  return __fmaf_rn(-neg_rem, r, q);
}

// RN(1 / s) for the kernels' scales, kFastDivMinScale <= s <= FLT_MAX / 448: the hardware's
// approximate reciprocal refined by one Newton step. __frcp_rn computes the same and adds a test
// for the ends of the exponent range, which these scales never reach; tests/cpp/
// test_exact_division.cu checks the two agree on every float32 of that range.
__device__ __forceinline__ float rcp_rn(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return __fmaf_rn(r, __fmaf_rn(-s, r, 1.0f), r);
}

// RN(amax / max) for a finite amax >= 0, given max_rcp = RN(1 / max): the fast division, exact for
// amax >= kFastDivMinScale, IEEE division below.
__device__ __forceinline__ float div_amax_rn(float amax, float max, float max_rcp) {
  return amax >= kFastDivMinScale ? div_rn_with_rcp(amax, max, max_rcp) : __fdiv_rn(amax, max);
}

// RN(amax / 448), FP8's scale, and RN(amax / 6), NVFP4's block scale before its encode scale, for
// a finite amax >= 0 (tests/cpp/test_exact_division.cu checks both for every such float32).
constexpr float kFp8MaxRcp = 1.0f / kFp8Max;
constexpr float kFp4Max = 6.0f;
constexpr float kFp4MaxRcp = 1.0f / kFp4Max;
__device__ __forceinline__ float scale_from_amax(float amax) { return div_amax_rn(amax, kFp8Max, kFp8MaxRcp); }
__device__ __forceinline__ float fp4_scale_from_amax(float amax) { return div_amax_rn(amax, kFp4Max, kFp4MaxRcp); }

// NVFP4's element factor RN(S / s), S the encode scale and s a block's nonzero e4m3 scale
// (2^-9 <= s <= 448), by the fast division where S is in [kFastFactorMinScale,
// kFastFactorMaxScale]: there S / s lies in [2^-11, 2^126), div_rn_with_rcp's range. Elsewhere
// (and for inf or NaN S) IEEE division, capped at FLT_MAX (NaN stays NaN).
// tests/cpp/test_exact_division.cu checks the fast division for every S in three binades and
// every s; its exactness does not depend on S's exponent in that range.
constexpr float kFastFactorMinScale = 0.25f;
constexpr float kFastFactorMaxScale = 0x1p116f;
__device__ __forceinline__ float fp4_factor(float global_scale, float s) {
  if (global_scale >= kFastFactorMinScale && global_scale <= kFastFactorMaxScale) {
    return div_rn_with_rcp(global_scale, s, rcp_rn(s));
  }
  const float ratio = __fdiv_rn(global_scale, s);
  return ratio > FLT_MAX ? FLT_MAX : ratio;
}

// UE8M0 exponent of a positive finite scale: round up to a power of two on the bit pattern
// (never through log2/exp2), clamped to [1, 254].
__device__ __forceinline__ uint32_t ue8m0_exponent(float s) {
  const uint32_t bits = __float_as_uint(s);
  const uint32_t e = (bits >> 23) + ((bits & 0x7FFFFFu) != 0u);
  return min(max(e, 1u), 254u);
}

// 2^(e - 127) as float.
__device__ __forceinline__ float ue8m0_to_float(uint32_t e) { return __uint_as_float(e << 23); }

// UE8M0 byte e of an exact power of two s = 2^(e - 127), e in [0, 254] (2^-127 is a float32
// subnormal: byte 0); 0xFF, UE8M0's NaN, for any other value (not a power of two, out of range,
// zero, negative, inf, NaN).
constexpr uint32_t kUE8M0NaN = 0xFFu;
constexpr uint32_t kUE8M0SubnormalBits = 0x00400000u;  // 2^-127
__device__ __forceinline__ uint32_t ue8m0_byte(float s) {
  const uint32_t bits = __float_as_uint(s);
  if (bits == kUE8M0SubnormalBits) return 0u;
  const bool pow2 = (bits & 0x7FFFFFu) == 0u && bits >= (1u << 23) && bits < (255u << 23);
  return pow2 ? bits >> 23 : kUE8M0NaN;
}

// The float32 bits of UE8M0 byte e: 2^(e - 127), a float32 NaN for 0xFF.
__device__ __forceinline__ uint32_t ue8m0_byte_bits(uint32_t e) {
  return e == 0u ? kUE8M0SubnormalBits : e == kUE8M0NaN ? 0x7FC00000u : e << 23;
}

// 2^(127 - e), exactly; 2^-127 (e = 254) is a float32 subnormal.
__device__ __forceinline__ float ue8m0_reciprocal(uint32_t e) {
  return __uint_as_float(e < 254u ? (254u - e) << 23 : 0x00400000u);
}

// Run quantize(divide), where divide(x) is x / s rounded to nearest, computed the cheapest exact
// way (SPEC 1, step 4): UE8M0 scales multiply by the exact reciprocal 2^-k (e is s's UE8M0 byte);
// fp32 scales take div_rn_with_rcp, or IEEE division for scales below kFastDivMinScale and for
// groups holding an infinity. One branch here, none per element.
template <bool kUE8M0, typename Quantize>
__device__ __forceinline__ void with_divide(float s, uint32_t e, bool has_inf, Quantize&& quantize) {
  if constexpr (kUE8M0) {
    const float inv = ue8m0_reciprocal(e);  // x * 2^-k is exact, so it equals x / 2^k
    quantize([inv](float x) { return x * inv; });
  } else if (s >= kFastDivMinScale && !has_inf) {
    const float r = rcp_rn(s);
    quantize([s, r](float x) { return div_rn_with_rcp(x, s, r); });
  } else {
    quantize([s](float x) { return __fdiv_rn(x, s); });
  }
}

// Two floats to two e4m3 bytes (low byte from `lo`): round to nearest even, saturate to ±448,
// NaN to NaN.
__device__ __forceinline__ uint32_t cvt_e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

// A float to its e4m3 byte (round to nearest even, saturating to ±448), and an e4m3 byte's
// value, exactly.
__device__ __forceinline__ uint32_t cvt_e4m3(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }
__device__ __forceinline__ float e4m3_to_float(uint32_t byte) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3)));
}

// The 4-bit e2m1 code of v (docs/contract.md, "NVFP4"): round to nearest even (ties go to the
// even code: up at 0.75, 1.75 and 3.5, down at 0.25, 1.25, 2.5 and 5), saturating to ±6 (±inf
// too); bit 3 is v's sign, zeros included; NaN becomes +6 (code 7). On the bit pattern, so that
// sm_90a, which has no e2m1 conversion, writes the same bytes as sm_100a: |v| is scaled by a
// power of two into [0, 2), where the codes are its multiples of 0.5, and a float add rounds it
// there (tests/cpp/test_e2m1.cu: the same codes as the boundaries above for all 2^32 inputs).
__device__ __forceinline__ uint32_t e2m1_code(float v) {
  // Saturate (fminf and fmaxf return the number beside a NaN: NaN becomes +6)
  const uint32_t c = __float_as_uint(fmaxf(fminf(v, 6.0f), -6.0f));
  const uint32_t a = c & 0x7FFFFFFFu;
  // The power of two: 1 below 2 (codes 0-4), 2 in [2, 4) (codes 4-6), 4 in [4, 6] (codes 6-7)
  const uint32_t power = max(a, 0x3F800000u) & 0x7F800000u;
  const float scaled = __uint_as_float(a - power + 0x3F800000u);  // exact
  // Round to halves: at 1.5 * 2^22 a float's unit in the last place is 0.5
  const uint32_t halves = __float_as_uint(scaled + 0x1.8p22f) - 0x4AC00000u;
  return (halves + ((power - 0x3F800000u) >> 22)) | ((c >> 28) & 0x8u);
}

// The byte of two e2m1 codes, `lo`'s in the low nibble: e2m1_code of each. In hardware where
// the target has it; NaN is then set to +6 explicitly, so that the bytes never depend on what
// the instruction makes of a NaN.
__device__ __forceinline__ uint32_t e2m1x2(float lo, float hi) {
#if FP8QUANT_HW_BLOCK_SCALED_CVT
  uint16_t pair;
  asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %2, %1;\n cvt.u16.u8 %0, t;\n}"
      : "=h"(pair)
      : "f"(lo), "f"(hi));
  uint32_t byte = pair;
  if (lo != lo) byte = (byte & 0xF0u) | 0x07u;
  if (hi != hi) byte = (byte & 0x0Fu) | 0x70u;
  return byte;
#else
  return e2m1_code(lo) | (e2m1_code(hi) << 4);
#endif
}

// The word of eight e2m1 codes of the products RN(v[i] * factor), element i in nibble i: the
// codes of e2m1x2, for finite v[i] and a factor >= 0 whose products are below 7 in magnitude
// (encode_nvfp4 checks RN(amax * factor) < 7 once a group), given `signs`: 0x8 in nibble i where
// v[i] is negative (zeros included), 0 elsewhere.
//
// sm_90a takes the magnitude's code as min(RN(2a), RN(a) + 2, RN(a / 2) + 4) for
// a = |RN(v[i] * factor)|: the three lines through the codes of [0, 2], [2, 4] and [4, 7) (0, 0.5,
// 1, 1.5, 2; 2, 3, 4; 4, 6, and 6 up to a = 7, past e2m1's largest value), each rounded to an
// integer, ties to even, by a float add at 2^23 (one FMA each), the least of them the code
// (rounding is monotonic). The sums share one binade, so their bit patterns compare as integers
// (one three-way integer min), and the code is their low byte. About 7 instructions an element
// against e2m1_code's 12: no sign, saturation or NaN work per element (tests/cpp/test_e2m1.cu:
// the codes of e2m1_code for every float32 below 7 in magnitude).
__device__ __forceinline__ uint32_t e2m1x8_product(const float* v, float factor, uint32_t signs) {
#if FP8QUANT_HW_BLOCK_SCALED_CVT
  uint32_t word = 0u;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint16_t pair;
    asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %2, %1;\n cvt.u16.u8 %0, t;\n}"
        : "=h"(pair)
        : "f"(__fmul_rn(v[2 * j], factor)), "f"(__fmul_rn(v[2 * j + 1], factor)));
    word |= static_cast<uint32_t>(pair) << (8 * j);
  }
  return word;
#else
  // Codes (the low byte of each sum's bits)
  uint32_t code[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float a = fabsf(__fmul_rn(v[i], factor));
    const uint32_t doubled = __float_as_uint(__fmaf_rn(a, 2.0f, 0x1p23f));
    const uint32_t shifted = __float_as_uint(__fadd_rn(a, 0x1p23f + 2.0f));
    const uint32_t halved = __float_as_uint(__fmaf_rn(a, 0.5f, 0x1p23f + 4.0f));
    code[i] = min(min(doubled, shifted), halved);
  }
  // Pack: two codes to a byte, four bytes to the word; then the signs
  uint32_t pair[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) pair[j] = code[2 * j] + (code[2 * j + 1] << 4);
  const uint32_t word =
      __byte_perm(__byte_perm(pair[0], pair[1], 0x0040), __byte_perm(pair[2], pair[3], 0x0040), 0x5410);
  return word | signs;
#endif
}

// `signs` for e2m1x8_product from the eight elements of T packed in w (low element first):
// 0x8 in nibble i where element i's sign bit is set. The elements' top bytes are gathered, even
// elements' and odd elements' apart, and their top bits moved to bits 3 and 7 of each byte.
template <typename T>
__device__ __forceinline__ uint32_t e2m1_signs(const uint32_t* w) {
  uint32_t even, odd;  // byte j: the top byte of element 2j / 2j + 1
  if constexpr (sizeof(T) == 4) {
    const uint32_t low = __byte_perm(__byte_perm(w[0], w[1], 0x0073), __byte_perm(w[2], w[3], 0x0073), 0x5410);
    const uint32_t high = __byte_perm(__byte_perm(w[4], w[5], 0x0073), __byte_perm(w[6], w[7], 0x0073), 0x5410);
    even = __byte_perm(low, high, 0x6420);
    odd = __byte_perm(low, high, 0x7531);
  } else {
    // Elements (0, 2, 1, 3) and (4, 6, 5, 7)
    const uint32_t first = __byte_perm(w[0], w[1], 0x7351), second = __byte_perm(w[2], w[3], 0x7351);
    even = __byte_perm(first, second, 0x5410);
    odd = __byte_perm(first, second, 0x7632);
  }
  return ((even >> 4) & 0x08080808u) | (odd & 0x80808080u);
}

// Widen input elements to float.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Four e4m3 bytes (low byte first) to floats, exactly.
__device__ __forceinline__ void unpack_e4m3x4(uint32_t w, float* v) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> (16 * i)), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// An fp8 value q of a block with scale s, dequantized as checkpoints are read for requantization
// (SPEC 3): the float32 product, rounded to bfloat16.
__device__ __forceinline__ float dequantize_bf16(float q, float s) {
  return __bfloat162float(__float2bfloat16_rn(__fmul_rn(q, s)));
}

// A float rounded to nearest even in the element type T.
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (sizeof(T) == 4) {
    return v;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    return __float2bfloat16_rn(v);
  }
}

// v rounded to nearest even in T and widened back.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// silu(g) as PyTorch evaluates F.silu on float32: g / (1 + exp(-g)) with the accurate expf and
// IEEE division (docs/contract.md, "MoE").
__device__ __forceinline__ float silu_exact(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

// silu(g) * u as PyTorch evaluates F.silu(gate) * up on tensors of T: silu_exact rounded to T;
// the product in float32, rounded to T.
template <typename T>
__device__ __forceinline__ float silu_mul(float g, float u) {
  return round_to<T>(__fmul_rn(round_to<T>(silu_exact(g)), u));
}

// Two packed 16-bit elements (low element first) to floats.
__device__ __forceinline__ float2 unpack2(uint32_t w, __nv_bfloat16) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}
__device__ __forceinline__ float2 unpack2(uint32_t w, __half) {
  __half2 h;
  memcpy(&h, &w, sizeof(w));
  return __half22float2(h);
}

// The bits of `v` as a To of the same size.
template <typename To, typename From>
__device__ __forceinline__ To bits_as(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To t;
  memcpy(&t, &v, sizeof(t));
  return t;
}

// Two 16-bit elements in one register.
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct Pair<__half> {
  using type = __half2;
};

// Two floats rounded to nearest even in 16-bit T, packed (low element first).
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __nv_bfloat16) {
  return bits_as<uint32_t>(__floats2bfloat162_rn(lo, hi));
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half) {
  return bits_as<uint32_t>(__floats2half2_rn(lo, hi));
}

// The products of two pairs of 16-bit T packed in words, each rounded once to T: the product
// of two 16-bit values is exact in float32, so this is the float32 product rounded to T (PTX's
// mul.rn on bf16x2 and f16x2 keeps subnormals; a NaN may carry another payload, which no
// quantizer reads).
template <typename T>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b, T) {
  using T2 = typename Pair<T>::type;
  return bits_as<uint32_t>(__hmul2(bits_as<T2>(a), bits_as<T2>(b)));
}

// __expf(x), bit for bit for |x| <= 64 (silu_mul2's fast path; it drops other values): the same
// multiply by log2(e) and the same hardware 2^y, by ex2's flushing form. For |y| < 126 (|x| <= 64
// gives |y| <= 92.4) 2^y is normal and the two forms agree; __expf's own form spends two more
// instructions, on the SiLU's dependent chain, scaling arguments below -126 (subnormal results).
__device__ __forceinline__ float expf_fast_normal(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, 1.4426950408889634f)));
  return y;
}

// The exact pair of silu_mul2, out of line: the kernels that call silu_mul2 for eight pairs would
// otherwise carry eight copies of it (two expf and two IEEE divisions each) for a path about one
// pair in a hundred takes, and pay for the code in instruction fetches.
template <typename T>
__device__ __noinline__ uint32_t silu_exact2(float g0, float g1) {
  return pack2(silu_exact(g0), silu_exact(g1), T{});
}

// silu(g) * u for two elements of 16-bit T packed in a word (low element first), rounded to T
// and packed the same way: bit for bit silu_mul<T> of each (a NaN's payload aside).
//
// silu first takes a fast path: __expf (as expf_fast_normal) and __fdividef land within
// (5 + 1.2 |g|) float32 ulps of silu_exact(g) (CUDA's documented bounds: 2 + 1.173 |x| ulps for
// __expf, 2 for __fdividef, half an ulp for the sum). Rounding is monotonic, so when both ends of
// a twice-as-wide interval around the fast value round to the same T, the exact value rounds
// there too; else (about one element in 500 of bf16 randn gates) the pair is computed exactly.
// The bound holds for |g| <= 64, clear of overflow and subnormals; beyond it (and for NaN) the
// fast value is computed anyway and dropped, so that a pair takes one branch, not two.
// tests/cpp/test_silu.cu checks every 16-bit g of both types.
constexpr float kSiluFastMaxAbs = 64.0f;

// silu_mul2's fast path for a gate pair g (kernels::silu_mul_slice's fix-ups-last form takes it
// too): the fast values, each with the half-width of the interval around it.
struct SiluFast {
  float a, b, da, db;
};

__device__ __forceinline__ SiluFast silu_fast2(float2 g) {
  SiluFast f;
  f.a = __fdividef(g.x, 1.0f + expf_fast_normal(-g.x));
  f.b = __fdividef(g.y, 1.0f + expf_fast_normal(-g.y));
  f.da = fabsf(f.a) * (10.0f + 2.4f * fabsf(g.x)) * 0x1p-23f;
  f.db = fabsf(f.b) * (10.0f + 2.4f * fabsf(g.y)) * 0x1p-23f;
  return f;
}

template <typename T>
__device__ __forceinline__ uint32_t silu_mul2(uint32_t gate, uint32_t up) {
  const float2 g = unpack2(gate, T{});
  const SiluFast f = silu_fast2(g);
  uint32_t silu = pack2(f.a - f.da, f.b - f.db, T{});
  const bool in_range = fabsf(g.x) <= kSiluFastMaxAbs && fabsf(g.y) <= kSiluFastMaxAbs;  // false for NaN
  if (!in_range || silu != pack2(f.a + f.da, f.b + f.db, T{})) silu = silu_exact2<T>(g.x, g.y);
  return mul2(silu, up, T{});
}

// RMSNorm (docs/contract.md, "RMSNorm"), on pairs of 16-bit T packed in words (low element
// first), each step as PyTorch evaluates it on tensors of T:
//   x + residual   float32 sum, rounded to T;
//   normalize      h * r in float32, rounded to T, times the weight, rounded to T
// where r = 1 / sqrt(sum of squares / H + eps), IEEE square root and divisions.
template <typename T>
__device__ __forceinline__ uint32_t add2(uint32_t a, uint32_t b) {
  const float2 x = unpack2(a, T{}), y = unpack2(b, T{});
  return pack2(__fadd_rn(x.x, y.x), __fadd_rn(x.y, y.y), T{});
}

__device__ __forceinline__ float rms_inverse(float sum_of_squares, int h, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_of_squares, static_cast<float>(h)), eps)));
}

template <typename T>
__device__ __forceinline__ uint32_t normalize2(uint32_t h, float r, uint32_t weight) {
  const float2 v = unpack2(h, T{});
  return mul2(pack2(__fmul_rn(v.x, r), __fmul_rn(v.y, r), T{}), weight, T{});
}

// m[0] = op over m[0..kN), as a tree of depth log2(kN) (m is overwritten).
template <int kN, typename V, typename Op>
__device__ __forceinline__ V tree_reduce(V (&m)[kN], Op op) {
#pragma unroll
  for (int stride = 1; stride < kN; stride *= 2) {
#pragma unroll
    for (int i = 0; i + stride < kN; i += 2 * stride) m[i] = op(m[i], m[i + stride]);
  }
  return m[0];
}

// Max of |x| over the elements of T packed in the words w, as float; NaN elements are dropped
// (an all-NaN input gives 0). 16-bit elements are compared two at a time, exactly: abs and max
// of bf16/fp16 values are bf16/fp16 values.
template <typename T, int kWords>
__device__ __forceinline__ float abs_max(const uint32_t (&w)[kWords]) {
  if constexpr (sizeof(T) == 4) {
    float m[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) m[i] = fabsf(__uint_as_float(w[i]));
    return fmaxf(0.0f, tree_reduce(m, [](float a, float b) { return fmaxf(a, b); }));
  } else {
    using T2 = typename Pair<T>::type;
    T2 m[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const uint32_t a = w[i] & 0x7FFF7FFFu;  // both signs cleared
      memcpy(&m[i], &a, sizeof(a));
    }
    const T2 pair = tree_reduce(m, [](T2 a, T2 b) { return __hmax2(a, b); });
    return fmaxf(0.0f, fmaxf(__low2float(pair), __high2float(pair)));
  }
}

// Max of |a| and |b| for the two 16-bit T of each word, NaN kept (a NaN element gives a NaN):
// one instruction with the magnitudes taken on its operands. Each half's sign bit is the xor of
// the operands' (xorsign): callers clear it. The host emulator (tests/emulation) takes the same
// on the bit patterns.
template <typename T>
__device__ __forceinline__ uint32_t abs_max_nan2(uint32_t a, uint32_t b) {
  uint32_t d;
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, __half>) {
    asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
#else
  constexpr uint32_t kInf = std::is_same_v<T, __half> ? 0x7C00u : 0x7F80u;
  d = 0u;
  for (int h = 0; h < 32; h += 16) {
    const uint32_t x = (a >> h) & 0x7FFFu, y = (b >> h) & 0x7FFFu;
    const uint32_t m = x > kInf || y > kInf ? 0x7FFFu : max(x, y);
    d |= (m | ((a ^ b) >> h & 0x8000u)) << h;
  }
#endif
  return d;
}

// Max of |x| over the elements of T packed in the words w, as float, when every element is
// finite (*finite; else the value is not the amax: NaN and infinity are not dropped). float: on
// the bit patterns, which with the sign cleared order as the magnitudes do, infinity above every
// finite value and NaN above infinity; 16-bit elements two at a time, NaN kept (abs_max_nan2).
template <typename T, int kWords>
__device__ __forceinline__ float abs_max_if_finite(const uint32_t (&w)[kWords], bool* finite) {
  uint32_t m[kWords];
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) m[i] = w[i] & 0x7FFFFFFFu;
    const uint32_t bits = tree_reduce(m, [](uint32_t a, uint32_t b) { return max(a, b); });
    *finite = bits < 0x7F800000u;
    return __uint_as_float(bits);
  } else {
#pragma unroll
    for (int i = 0; i < kWords; ++i) m[i] = w[i];
    const uint32_t pair = tree_reduce(m, [](uint32_t a, uint32_t b) { return abs_max_nan2<T>(a, b); });
    // The two halves' max, its sign cleared
    const uint32_t bits = abs_max_nan2<T>(pair, __byte_perm(pair, 0u, 0x1032)) & 0x7FFFu;
    if constexpr (std::is_same_v<T, __half>) {
      *finite = bits < 0x7C00u;
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    } else {
      *finite = bits < 0x7F80u;
      return __uint_as_float(bits << 16);
    }
  }
}

}  // namespace fp8quant::math
