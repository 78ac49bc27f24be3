// NVFP4's plain-rows chunks (block_scaled_quant.cuh, kChunked) emulated on the host against the
// team kernel (a group a thread), every output byte: q equal wherever a group is stored and each
// launch's own poison elsewhere (so that a byte written outside the groups, or one left
// unwritten, shows), every scale byte equal (the scale buffers are poisoned differently too).
// Buffers are sized exactly (run.sh builds with AddressSanitizer: a byte read or written past one
// fails). Three dtypes, both scale layouts, aligned and byte-wise paths (odd row strides), K at
// every edge of the chunk grid, M from 1 to 300, one batch to 40, one encode scale or one each
// (0, negative, NaN, inf, huge among them). The team kernel shares the chunks' group arithmetic
// (group_slice.cuh): the reference check (EMU_DUMP=DIR, compare_reference.py) is what tests the
// numbers. Built and run by run.sh.
#include <cstdio>
#include <random>
#include <vector>

#include "api/group_quant.hpp"
#include "kernels/block_scaled_quant.cuh"

using namespace fp8quant;
using namespace fp8quant::kernels;

namespace {

struct EmuArch {};

// Run the kernel's grid, its blocks' threads one after another (neither kernel meets at a
// barrier).
template <typename T, bool kSwizzled, bool kAligned, bool kChunked>
void launch(const BlockScaledProblem& p, unsigned grid_x, unsigned grid_y) {
  constexpr auto kernel =
      block_scaled_quant_kernel<EmuArch, T, BlockFormat::kNvfp4, kSwizzled, kAligned, QuantSource::kRows, kChunked>;
  gridDim = {grid_x, grid_y, 1};
  blockDim = {kMxThreads, 1, 1};
  for (unsigned by = 0; by < grid_y; ++by) {
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      for (unsigned t = 0; t < kMxThreads; ++t) {
        threadIdx = {t, 0, 0};
        blockIdx = {bx, by, 0};
        kernel(p);
      }
    }
  }
}

template <typename T>
T from_float(float f) {
  if constexpr (sizeof(T) == 4) {
    return f;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(f);
  } else {
    return __float2bfloat16_rn(f);
  }
}

long launches = 0, failures = 0;

// One shape: x [batch, m, k] with pad_cols more elements a row (and q bytes a row), random groups
// of many magnitudes and specials; the team kernel's bytes against the chunks'.
template <typename T, bool kSwizzled, bool kAligned>
void compare(int batch, int m, int k, int pad_cols, std::mt19937& rng, const std::vector<float>& global_scales) {
  const int groups = k / 16;
  const int rows = kSwizzled ? (m + 127) / 128 * 128 : m;
  const int slots = kSwizzled ? (groups + 3) / 4 * 4 : groups;
  const int64_t x_row = k + pad_cols, x_batch = int64_t(m) * x_row + 8 * pad_cols;
  const int64_t q_row = k / 2 + pad_cols, q_batch = int64_t(m) * q_row + 8 * pad_cols;

  // Input
  std::vector<T> x(size_t(batch - 1) * x_batch + size_t(m - 1) * x_row + k);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> magnitude(-30, 30), pick(0, 999);
  for (int b = 0; b < batch; ++b) {
    for (int r = 0; r < m; ++r) {
      for (int g = 0; g < groups; ++g) {
        const float scale = std::ldexp(1.0f, magnitude(rng));
        for (int e = 0; e < 16; ++e) {
          float v = normal(rng) * scale;
          const int s = pick(rng);
          if (s == 0) v = NAN;
          if (s == 1) v = INFINITY;
          if (s == 2) v = -INFINITY;
          if (s == 3) v = -0.0f;
          if (s == 4) v = std::ldexp(1.0f, -140);
          if (s == 5) v = 3.0e38f;
          if (s >= 6 && s < 40 && g % 7 == 3) v = 0.0f;  // groups mostly or wholly zero
          x[size_t(b) * x_batch + size_t(r) * x_row + size_t(g) * 16 + e] = from_float<T>(v);
        }
      }
    }
  }

  // Launches
  const size_t q_bytes = size_t(batch - 1) * q_batch + size_t(m - 1) * q_row + k / 2;
  const size_t scale_bytes = size_t(batch) * rows * slots;
  std::vector<uint8_t> q_team(q_bytes, 0xAB), q_chunks(q_bytes, 0xCD);
  std::vector<uint8_t> s_team(scale_bytes, 0xAB), s_chunks(scale_bytes, 0xCD);
  BlockScaledProblem p{};
  api::set_group_operands(p, {"x", "", "", x.data(), sizeof(T), x_batch, x_row}, nullptr,
                          {"q", "", "", nullptr, 1, q_batch, q_row}, batch, m, groups, rows, slots);
  p.scale_batch_stride = int64_t(rows) * slots;
  p.units = rows * slots;
  p.row_slots = FastDivisor(uint32_t(slots));
  p.format = BlockFormat::kNvfp4;
  p.source = QuantSource::kRows;
  p.global_scale = global_scales.data();
  p.global_scales = int32_t(global_scales.size());
  p.aligned = kAligned;

  BlockScaledProblem team = p;
  team.q = q_team.data();
  team.scale = s_team.data();
  launch<T, kSwizzled, kAligned, false>(team, (p.units + kMxThreads - 1) / kMxThreads, batch);

  BlockScaledProblem chunks = p;
  chunks.q = q_chunks.data();
  chunks.scale = s_chunks.data();
  chunks.chunks = (slots + kChunkSlots - 1) / kChunkSlots;  // as the launcher sets them
  chunks.chunk_units = rows * chunks.chunks;
  chunks.row_chunks = FastDivisor(uint32_t(chunks.chunks));
  launch<T, kSwizzled, kAligned, true>(chunks, (chunks.chunk_units + kMxWarps - 1) / kMxWarps, batch);

  if (const char* dir = std::getenv("EMU_DUMP")) {
    char path[512];
    std::snprintf(path, sizeof path, "%s/case_%ld.bin", dir, launches);
    FILE* f = std::fopen(path, "wb");
    const int32_t meta[8] = {int32_t(sizeof(T)), std::is_same_v<T, __half>,    kSwizzled, batch, m, k,
                             pad_cols,           int32_t(global_scales.size())};
    std::fwrite(meta, 4, 8, f);
    std::fwrite(global_scales.data(), 4, global_scales.size(), f);
    std::fwrite(x.data(), sizeof(T), x.size(), f);
    std::fwrite(q_chunks.data(), 1, q_bytes, f);
    std::fwrite(s_chunks.data(), 1, scale_bytes, f);
    std::fclose(f);
  }
  ++launches;

  // Compare
  size_t bad_q = 0, bad_scales = 0;
  for (size_t i = 0; i < q_bytes; ++i) {
    const int64_t b = int64_t(i) / q_batch, in_batch = int64_t(i) % q_batch;
    const bool stored = b < batch && in_batch / q_row < m && in_batch % q_row < k / 2;
    bad_q += stored ? q_team[i] != q_chunks[i] : q_team[i] != 0xAB || q_chunks[i] != 0xCD;
  }
  for (size_t i = 0; i < scale_bytes; ++i) bad_scales += s_team[i] != s_chunks[i];
  if (bad_q != 0 || bad_scales != 0) {
    ++failures;
    std::printf("FAIL %zu-byte %s %s batch=%d m=%d k=%d pad=%d: %zu q bytes, %zu scale bytes\n", sizeof(T),
                kSwizzled ? "swizzled" : "row", kAligned ? "aligned" : "byte-wise", batch, m, k, pad_cols, bad_q,
                bad_scales);
  }
}

template <typename T, bool kSwizzled, bool kAligned>
void sweep(std::mt19937& rng) {
  // (1e30 and 1e36 either side of 2^116, 7.3e-5 below 1/4: fp4_factor's fast division and IEEE's)
  const float pool[] = {1.0f, 2688.0f / 3.5f, 0.0f, -1.5f, 1e30f, NAN, 7.3e-5f, INFINITY, 1e36f};
  const auto scales = [&](int batch, int salt, bool one) {
    std::vector<float> global_scales;
    for (int b = 0; b < (one ? 1 : batch); ++b) global_scales.push_back(pool[(salt + b * 3) % 9]);
    return global_scales;
  };
  // Aligned rows pad by whole 16-byte vectors; byte-wise ones by an odd count
  const auto pad = [](int k) { return kAligned ? (k % 3) * 8 : 2 * (k % 3) + 1; };
  for (int k : {1008, 1024, 1040, 1536, 2048, 2064, 2560, 4096, 7168, 7184}) {
    for (int m : {1, 3, 127, 129, 300}) {
      const int batch = (m + k) % 3 == 0 ? 3 : 1;
      compare<T, kSwizzled, kAligned>(batch, m, k, pad(k), rng, scales(batch, m + k / 16, m == 3));
    }
  }
  // Many batches of few rows (swizzled: padding rows dominate)
  compare<T, kSwizzled, kAligned>(40, 2, 2048, pad(2048), rng, scales(40, 1, false));
  compare<T, kSwizzled, kAligned>(40, 3, 2064, pad(2064), rng, scales(40, 2, true));
}

}  // namespace

int main() {
  std::mt19937 rng(1234);
  sweep<__nv_bfloat16, true, true>(rng);
  sweep<__nv_bfloat16, false, true>(rng);
  sweep<__nv_bfloat16, true, false>(rng);
  sweep<__half, true, true>(rng);
  sweep<__half, false, false>(rng);
  sweep<float, true, true>(rng);
  sweep<float, false, true>(rng);
  std::printf("%ld launches compared, %ld failed\n", launches, failures);
  return failures != 0;
}
