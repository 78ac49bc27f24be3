// The masked SiLU-and-mul's walk (walk_tiles, moe_rows.cuh) in the FP8 group quantizer
// (per_token_group_quant.cuh) and the block-scaled kernel (block_scaled_quant.cuh), kWalk,
// emulated on the host against the same kernels one block a tile (the launch below the walk's
// threshold, which the GPU suite verified before the walk), every byte of q and the scales: FP8
// with row, mn_tma and packed UE8M0 scales; MXFP8 (RCEIL) and NVFP4, both scale layouts. Which bytes a
// launch writes is told by launching it twice over two poisons: the two launches must write the
// same bytes (with the same values) and leave the same bytes alone. Routings: spread, skewed
// onto a few experts, empty, full; tile rows (align) 128 and 16; the walk's grid at 1 to 2 waves
// of a pretend GPU's blocks. Built and run by run.sh.
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

#include "api/group_quant.hpp"
#include "kernels/block_scaled_quant.cuh"
#include "kernels/per_token_group_quant.cuh"

using namespace fp8quant;
using namespace fp8quant::kernels;

namespace {

struct EmuArch {
  static constexpr int kBlockThreads = 256;
};

long launches = 0, failures = 0;

// A launch's q and scale bytes.
struct Bytes {
  std::vector<uint8_t> q, scale;
};

// The bytes the tile launch wrote (equal over its two poisons) against the walk's: the same bytes
// written, with the same values; the number of bytes that differ, and *written the tile launch's.
size_t differ(const Bytes& tile_a, const Bytes& tile_b, const Bytes& walk_a, const Bytes& walk_b, size_t* written) {
  size_t bad = 0;
  const auto check = [&](const std::vector<uint8_t>& ta, const std::vector<uint8_t>& tb, const std::vector<uint8_t>& wa,
                         const std::vector<uint8_t>& wb) {
    for (size_t i = 0; i < ta.size(); ++i) {
      const bool tile_wrote = ta[i] == tb[i], walk_wrote = wa[i] == wb[i];
      *written += tile_wrote;
      bad += tile_wrote != walk_wrote || (tile_wrote && ta[i] != wa[i]);
    }
  };
  check(tile_a.q, tile_b.q, walk_a.q, walk_b.q);
  check(tile_a.scale, tile_b.scale, walk_a.scale, walk_b.scale);
  return bad;
}

// Run `tiles` one block a tile (its grid) and `walk` on `walkers` blocks, `threads` a block, each
// twice over two poisons, and count the launch: the bytes that differ (differ), and *written the
// tile launch's.
template <class Problem, class Tiles, class Walk>
size_t compare_launches(const Problem& p, Tiles tiles, dim3 grid, Walk walk, uint32_t walkers, unsigned threads,
                        size_t q_bytes, size_t scale_bytes, size_t* written) {
  const auto run = [&](auto kernel, uint8_t poison, unsigned grid_x, unsigned grid_y) {
    Bytes out{std::vector<uint8_t>(q_bytes, poison), std::vector<uint8_t>(scale_bytes, poison)};
    Problem launched = p;
    launched.q = out.q.data();
    launched.scale = out.scale.data();
    emu_launch(kernel, launched, grid_x, grid_y, threads);
    return out;
  };
  const Bytes tile_a = run(tiles, 0xAB, grid.x, grid.y), tile_b = run(tiles, 0xCD, grid.x, grid.y);
  const Bytes walk_a = run(walk, 0xAB, walkers, 1), walk_b = run(walk, 0xCD, walkers, 1);
  ++launches;
  return differ(tile_a, tile_b, walk_a, walk_b, written);
}

// x [experts, max_m, 2n] bf16 (gate | up), the rows past each expert's count NaN.
std::vector<__nv_bfloat16> silu_input(int experts, int max_m, int n, const std::vector<int32_t>& counts,
                                      std::mt19937& rng) {
  std::vector<__nv_bfloat16> x(size_t(experts) * max_m * 2 * n);
  std::normal_distribution<float> normal;
  for (int e = 0; e < experts; ++e) {
    for (int r = 0; r < max_m; ++r) {
      for (int i = 0; i < 2 * n; ++i) {
        x[(size_t(e) * max_m + r) * 2 * n + i] = __float2bfloat16_rn(r < counts[e] ? 3.0f * normal(rng) : NAN);
      }
    }
  }
  return x;
}

// FP8 (groups of 128) with kOrder's scales: the tile launch's bytes against the walk's at a
// pretend GPU of sm_count SMs holding `resident` blocks each.
template <ScaleOrder kOrder, bool kUE8M0>
void compare_fp8(int experts, int max_m, int n, int align, const std::vector<int32_t>& counts, int sm_count,
                 int resident, std::mt19937& rng) {
  constexpr int kTeam = 128 / kElemsPerThread;
  const std::vector<__nv_bfloat16> x = silu_input(experts, max_m, n, counts, rng);
  const int groups = n / 128;
  const int rows = kOrder == ScaleOrder::kRow ? max_m : (max_m + 3) / 4 * 4;  // mn_tma, packed: aligned to 4
  const int cols = kOrder == ScaleOrder::kPacked ? (groups + 3) / 4 : groups;
  const int slots = kOrder == ScaleOrder::kPacked ? cols * 4 : groups;
  QuantProblem p{};
  api::set_group_operands(p, {"x", "", "", x.data(), 2, int64_t(max_m) * 2 * n, 2 * n}, nullptr,
                          {"q", "", "", nullptr, 1, int64_t(max_m) * n, n}, experts, max_m, groups, rows, slots);
  p.scale_batch_stride = int64_t(rows) * cols;
  p.units = static_cast<int32_t>(team_units(1, rows, slots));  // team_row_tile of the SiLU source: 1
  p.tile_units = FastDivisor(uint32_t(slots));
  p.sm_count = sm_count;
  p.eps = 1e-10f;
  p.layout = kOrder == ScaleOrder::kRow      ? FP8QUANT_SCALE_ROW
             : kOrder == ScaleOrder::kPacked ? FP8QUANT_SCALE_PACKED_UE8M0
                                             : FP8QUANT_SCALE_MN_TMA;
  p.group_size = 128;
  p.ue8m0 = kUE8M0;
  p.aligned = true;
  p.source = QuantSource::kSiluMul;
  p.up_offset = n;
  p.row_counts = counts.data();
  p.pad_align = FastDivisor(uint32_t(align));
  const int threads = block_threads<EmuArch, kTeam>(p);
  const dim3 grid = token_and_padding_grid<kPadColumns>(p, threads / kTeam, scale_columns<kOrder>(p), false);
  const uint32_t walkers = walk_blocks(p, int64_t{sm_count} * resident);
  if (walkers == 0) return;  // below the walk's threshold

  constexpr auto tiles =
      per_token_group_quant_kernel<EmuArch, __nv_bfloat16, 128, kOrder, kUE8M0, true, QuantSource::kSiluMul, false>;
  constexpr auto walk =
      per_token_group_quant_kernel<EmuArch, __nv_bfloat16, 128, kOrder, kUE8M0, true, QuantSource::kSiluMul, true>;
  const size_t q_bytes = size_t(experts) * max_m * n, scale_bytes = size_t(experts) * rows * cols * 4;
  size_t written = 0;
  const size_t bad = compare_launches(p, tiles, grid, walk, walkers, threads, q_bytes, scale_bytes, &written);
  if (bad != 0 || written == 0) {
    ++failures;
    std::printf(
        "FAIL fp8 order=%d experts=%d max_m=%d n=%d align=%d sms=%d x %d walkers=%u: %zu bytes differ (%zu "
        "written)\n",
        static_cast<int>(kOrder), experts, max_m, n, align, sm_count, resident, walkers, bad, written);
  }
}

// MXFP8 or NVFP4 (kFormat) with swizzled or row-major scales: the tile launch's bytes against the
// walk's on a pretend GPU holding `wave` blocks.
template <BlockFormat kFormat, bool kSwizzled>
void compare_block_scaled(int experts, int max_m, int n, int align, const std::vector<int32_t>& counts, int64_t wave,
                          std::mt19937& rng) {
  using Format = FormatOf<kFormat>;
  const int groups = n / Format::kGroup;
  const int rows = kSwizzled ? (max_m + 127) / 128 * 128 : max_m;
  const int slots = kSwizzled ? (groups + 3) / 4 * 4 : groups;
  const int64_t x_row = 2 * n, x_batch = int64_t(max_m) * x_row;
  const int64_t q_row = Format::kFp4 ? n / 2 : n, q_batch = int64_t(max_m) * q_row;
  const std::vector<__nv_bfloat16> x = silu_input(experts, max_m, n, counts, rng);
  std::vector<float> scales(experts);
  for (int e = 0; e < experts; ++e) scales[e] = 100.0f + e;

  BlockScaledProblem p{};
  api::set_group_operands(p, {"x", "", "", x.data(), 2, x_batch, x_row}, nullptr,
                          {"q", "", "", nullptr, 1, q_batch, q_row}, experts, max_m, groups, rows, slots);
  p.scale_batch_stride = int64_t(rows) * slots;
  p.units = rows * slots;
  p.row_slots = FastDivisor(uint32_t(slots));
  p.format = kFormat;
  p.source = QuantSource::kSiluMul;
  p.up_offset = n;
  p.row_counts = counts.data();
  p.pad_align = FastDivisor(uint32_t(align));
  p.global_scale = scales.data();
  p.global_scales = experts;
  p.aligned = true;
  constexpr int kTeams = kMxThreads / Format::kTeam;
  const dim3 grid = token_and_padding_grid<kPadSlots>(p, kTeams, p.slots, false);  // sets token_blocks
  const uint32_t walkers = walk_blocks(p, wave);
  if (walkers == 0) return;  // below the walk's threshold at this wave

  constexpr auto tiles =
      block_scaled_quant_kernel<EmuArch, __nv_bfloat16, kFormat, kSwizzled, true, QuantSource::kSiluMul, false, false>;
  constexpr auto walk =
      block_scaled_quant_kernel<EmuArch, __nv_bfloat16, kFormat, kSwizzled, true, QuantSource::kSiluMul, false, true>;
  const size_t q_bytes = size_t(experts) * q_batch, scale_bytes = size_t(experts) * rows * slots;
  size_t written = 0;
  const size_t bad = compare_launches(p, tiles, grid, walk, walkers, kMxThreads, q_bytes, scale_bytes, &written);
  if (bad != 0 || written == 0) {
    ++failures;
    std::printf("FAIL %s %s experts=%d max_m=%d n=%d align=%d wave=%lld walkers=%u: %zu bytes differ (%zu written)\n",
                Format::kFp4 ? "nvfp4" : "mxfp8", kSwizzled ? "swizzled" : "row", experts, max_m, n, align,
                static_cast<long long>(wave), walkers, bad, written);
  }
}

// Routings of each shape: spread (empty, full, 17 and 128 rows among them) and skewed onto three
// experts (one of a row); tile rows 128 and 16.
template <class Compare>
void sweep(Compare compare, std::mt19937& rng) {
  for (auto [experts, max_m, n] : {std::tuple{24, 16, 512}, std::tuple{24, 130, 256}, std::tuple{40, 300, 128}}) {
    std::uniform_int_distribution<int> any(0, max_m);
    std::vector<int32_t> spread(experts), skewed(experts, 0);
    for (int e = 0; e < experts; ++e) spread[e] = any(rng);
    spread[0] = 0, spread[1] = max_m, spread[2] = std::min(17, max_m), spread[3] = std::min(128, max_m);
    skewed[5] = max_m, skewed[experts / 2] = 1, skewed[experts - 1] = max_m;
    for (const auto& counts : {spread, skewed}) {
      for (int align : {128, 16}) compare(experts, max_m, n, align, counts);
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(99);
  // FP8: waves of 2 x 1, 2 x 4 and 3 x 3 blocks
  for (auto [sms, resident] : {std::pair{2, 1}, std::pair{2, 4}, std::pair{3, 3}}) {
    const auto fp8 = [&](auto order, auto ue8m0) {
      sweep(
          [&](int e, int m, int n, int align, const std::vector<int32_t>& counts) {
            if (n % 128 == 0)
              compare_fp8<decltype(order)::value, decltype(ue8m0)::value>(e, m, n, align, counts, sms, resident, rng);
          },
          rng);
    };
    fp8(std::integral_constant<ScaleOrder, ScaleOrder::kRow>{}, std::false_type{});
    fp8(std::integral_constant<ScaleOrder, ScaleOrder::kColumn>{}, std::false_type{});
    fp8(std::integral_constant<ScaleOrder, ScaleOrder::kPacked>{}, std::true_type{});
  }
  // Block-scaled: waves of 2, 5 and 11 blocks
  for (int64_t wave : {2, 5, 11}) {
    const auto block_scaled = [&](auto format, auto swizzled) {
      sweep(
          [&](int e, int m, int n, int align, const std::vector<int32_t>& counts) {
            compare_block_scaled<decltype(format)::value, decltype(swizzled)::value>(e, m, n, align, counts, wave, rng);
          },
          rng);
    };
    block_scaled(std::integral_constant<BlockFormat, BlockFormat::kMxfp8Rceil>{}, std::true_type{});
    block_scaled(std::integral_constant<BlockFormat, BlockFormat::kMxfp8Rceil>{}, std::false_type{});
    block_scaled(std::integral_constant<BlockFormat, BlockFormat::kNvfp4>{}, std::true_type{});
    block_scaled(std::integral_constant<BlockFormat, BlockFormat::kNvfp4>{}, std::false_type{});
  }
  std::printf("%ld walks compared, %ld failed\n", launches, failures);
  return failures != 0 || launches == 0;
}
