// MoE routing metadata, deterministic and without atomics on the layout. The i-th slot of an
// expert in flat order gets rank i: row, token, masked row; the expert's padding rows and the
// rows past M_sum are marked -1, and a bound that was too small is reported in the status word.
//
// Up to kOneKernelExperts experts, two shapes by slot count, both built from the same pieces
// (per-run counts in shared memory, their scan, the ballot-ranked placement, the row marking):
//
// Below kRoutingChunkedSlots: one kernel. Every block counts all the slots per run in shared memory
//   (shared atomics) and scans the aligned counts; then it places the slots of the runs it owns,
//   walking them again (ranks within a step from ballots), and marks the rows that hold no token
//   of its share: the padding rows of the experts dealt to its warps, and a slice of the rows
//   past M_sum. The blocks repeat the counting (the ids, L2-resident) so that no block waits for
//   another; the work grows with blocks * slots.
// From kRoutingChunkedSlots: chunks of at least kRoutingChunkSlots slots, one block each, so that
//   each slot is counted and placed once, in two kernels:
//   chunk count  each block counts its chunk's slots per expert (and block 0 zeroes the status
//                word);
//   chunk place  each block counts its chunk's slots per run, sums the chunks' counts per
//                expert (all of them, and those of the chunks before its own), arrives at the
//                barrier below, scans the aligned counts into the first rows (block 0 stores them
//                and the counts), waits at the barrier, then places its slots and marks its share
//                of the rows that hold no token.
//   The per-chunk counts live in inv_perm, the output the placement writes last: chunk c's
//   counts in its own first `experts` slots (a chunk holds at least kRoutingChunkSlots >= experts).
//   Every block reads every chunk's counts, so the blocks meet at a barrier before any places a
//   slot: the placement launches cooperatively (every block resident at once; with PDL where the
//   driver takes both attributes), and the status word counts the blocks in and out (the last
//   one out stores the status).
//   Where the cooperative launch fails (more chunks than the GPU, or the SMs this context may
//   use, holds blocks at once; or FP8QUANT_COOPERATIVE=0), three kernels: the chunk count, a
//   chunk scan (one block sums the chunks' counts per expert, turns each chunk's into the
//   expert's slots in the chunks before it, and stores the first rows, counts and status), and a
//   placement that reads the scan's results instead of summing.
//
// More experts: two kernels.
//   count   one block per local expert counts its slots (counts[e]);
//   place   one block per local expert sums the aligned counts of the experts before it (its
//           first row), counts its slots again and places them in order; then marks its padding
//           rows. One more block marks the dropped slots and the rows past M_sum, and reports
//           the bounds.
// Each warp of a block owns one run of consecutive slots and walks it 32 slots a step, its lanes
// reading consecutive ids (one 128-byte access a step); a slot's rank within the run comes from
// ballots, and the runs' totals are summed across the block through shared memory (a few
// barriers per kernel, none per step). Every block reads all t * k ids, so the work grows with
// experts * slots.
//
// Programmatic dependent launch: nothing touches global memory before griddepcontrol.wait
// (docs/kernels.md); each kernel's wait also orders it after the routing kernels before it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/dispatch.hpp"
#include "common/error.hpp"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "fp8quant/moe.h"
#include "kernels/moe_routing.hpp"

namespace fp8quant::kernels {

constexpr int kRoutingThreads = 1024;
constexpr int kRoutingWarps = kRoutingThreads / 32;

constexpr int32_t kOneKernelExperts = 512;  // the per-run counts fit shared memory
constexpr int32_t kOneKernelRowsPerBlock = 1024;
constexpr int32_t kOneKernelMaxBlocks = 128;
// Dynamic shared memory a routing kernel takes without opting in to more (the default limit is
// 48 KiB with its static arrays; 256 experts' per-run counts fit)
constexpr size_t kDefaultMaxDynamicSmem = 32 * 1024;

// Chunks: from kRoutingChunkedSlots slots on (where the one kernel's count and walk, which every block
// repeats over all the slots, cost more than one or two more launches), the slots are cut into
// routing_chunks(slots) chunks of routing_chunk_slots(slots), the last one taking the remainder
// too: at most kRoutingMaxChunks, each at least kRoutingChunkSlots. About 64 chunks place fastest
// at every T measured (fewer leave the count and placement with too few blocks, more make each
// block sum more chunks' counts): docs/benchmarks-history.md, twenty-sixth run. The least size
// leaves 32 chunks at 16384 slots.
constexpr int32_t kRoutingChunkedSlots = 16384;
constexpr int32_t kRoutingChunkSlots = 512;
constexpr int32_t kRoutingMaxChunks = 64;
static_assert(kRoutingChunkSlots >= kOneKernelExperts, "a chunk's counts fit in its own first slots");
static_assert(kRoutingChunkedSlots >= kRoutingChunkSlots, "a chunked routing has a chunk");

__host__ __device__ __forceinline__ int32_t routing_chunk_slots(int32_t slots) {
  const int32_t even = ((slots + kRoutingMaxChunks - 1) / kRoutingMaxChunks + 31) / 32 * 32;
  return even > kRoutingChunkSlots ? even : kRoutingChunkSlots;
}
__host__ __device__ __forceinline__ int32_t routing_chunks(int32_t slots) { return slots / routing_chunk_slots(slots); }

// Which routing takes `p`: the one kernel, the chunk kernels, or (more experts) the count and
// place kernels.
enum class RoutingShape { kOneKernel, kChunks, kPerExpert };
inline RoutingShape routing_shape(const RoutingProblem& p) {
  if (p.experts > kOneKernelExperts) return RoutingShape::kPerExpert;
  return p.slots < kRoutingChunkedSlots ? RoutingShape::kOneKernel : RoutingShape::kChunks;
}

// The local expert of slot s, or -1 for a dropped slot.
template <typename IdT>
__device__ __forceinline__ int64_t local_expert(const RoutingProblem& p, int32_t s) {
  const int64_t id = static_cast<int64_t>(static_cast<const IdT*>(p.topk_ids)[s]);
  const int64_t e = id - p.expert_offset;
  return id < 0 || e < 0 || e >= p.experts ? -1 : e;
}

// Slots [begin, end): a block's share, or a warp's run of it.
struct Run {
  int32_t begin, end;
};

// Chunk c of the chunked routing.
__device__ __forceinline__ Run routing_chunk(const RoutingProblem& p, int32_t c) {
  const int32_t size = routing_chunk_slots(p.slots);
  return {c * size, c == routing_chunks(p.slots) - 1 ? p.slots : (c + 1) * size};
}

// This warp's run of the block's slots `all`: whole steps of 32, the last run cut at the end.
__device__ __forceinline__ int32_t run_slots(Run all) {
  return (all.end - all.begin + kRoutingThreads - 1) / kRoutingThreads * 32;
}
__device__ __forceinline__ Run warp_run(Run all) {
  const int32_t per = run_slots(all);
  const int32_t begin = all.begin + min(static_cast<int32_t>(threadIdx.x / 32) * per, all.end - all.begin);
  return {begin, begin + min(per, all.end - begin)};
}

// Runs that hold slots: the first ones, at most kRoutingWarps (none without slots; no sum that
// could pass INT32_MAX for slots near it).
__device__ __forceinline__ int32_t nonempty_runs(Run all) {
  return all.end == all.begin ? 0 : (all.end - all.begin - 1) / run_slots(all) + 1;
}

// Every slot.
__device__ __forceinline__ Run all_slots(const RoutingProblem& p) { return {0, p.slots}; }

// No slot: a lane past the end of its run.
constexpr int64_t kNoSlot = -2;

// visit(s, expert) on every lane for each step of the run in order (lane i at slot step + i;
// expert kNoSlot past the end; steps past the run's end are skipped), its ids loaded kBatch steps
// at a time. Every lane calls visit, so it may use warp votes.
template <typename IdT, typename Visit>
__device__ __forceinline__ void for_each_step(const RoutingProblem& p, Run run, Visit&& visit) {
  constexpr int kBatch = 8;
  const int32_t lane = threadIdx.x % 32;
  for (int32_t base = run.begin; base < run.end; base += 32 * kBatch) {
    int64_t experts[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int32_t s = base + 32 * i + lane;
      experts[i] = s < run.end ? local_expert<IdT>(p, s) : kNoSlot;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (base + 32 * i >= run.end) break;  // the same on every lane: no slot left in the run
      visit(base + 32 * i + lane, experts[i]);
    }
  }
}

__device__ __forceinline__ int64_t aligned_count(const RoutingProblem& p, int32_t e) {
  const int64_t c = p.counts[e];
  return (c + p.align - 1) / p.align * p.align;
}

// Clamp a row to int32 (a bound past it is reported in the status).
__device__ __forceinline__ int32_t clamp_row(int64_t r) { return static_cast<int32_t>(min(r, int64_t{INT32_MAX})); }

// Place slot s, the rank-th slot of expert e whose first row is first_row; note a bound it
// does not fit.
__device__ __forceinline__ void place_slot(const RoutingProblem& p, int32_t s, int32_t e, int64_t first_row,
                                           int64_t rank, bool& rows_overflow, bool& max_m_overflow) {
  const int64_t row = first_row + rank;
  if (row < p.rows) {
    p.inv_perm[s] = static_cast<int32_t>(row);
    p.m_indices[row] = e;
    p.row_token[row] = s / p.k;
  } else {
    p.inv_perm[s] = -1;
    rows_overflow = true;
  }
  if (p.masked_row != nullptr) {
    const bool fits = rank < p.max_m;
    p.masked_row[s] = fits ? static_cast<int32_t>(int64_t{e} * p.max_m + rank) : -1;
    max_m_overflow |= !fits;
  }
}

// Mark dropped slot s.
__device__ __forceinline__ void drop_slot(const RoutingProblem& p, int32_t s) {
  p.inv_perm[s] = -1;
  if (p.masked_row != nullptr) p.masked_row[s] = -1;
}

// --- The count and place kernels (more than kOneKernelExperts experts) ------------------------

template <class Arch, typename IdT>
__global__ void __launch_bounds__(kRoutingThreads) moe_count_kernel(const __grid_constant__ RoutingProblem p) {
  __shared__ int64_t partial[kRoutingWarps];
  const int32_t e = blockIdx.x;

  // Wait for the previous kernel's writes; let the placement kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Count this expert's slots
  int64_t mine = 0;
  for_each_step<IdT>(p, warp_run(all_slots(p)), [&](int32_t, int64_t x) { mine += x == e; });
  const int64_t count = block_reduce<kRoutingWarps, true>(mine, SumOp{}, partial);
  if (threadIdx.x == 0) {
    p.counts[e] = static_cast<int32_t>(count);
    if (e == 0) *p.status = FP8QUANT_ROUTING_OK;
  }
}

template <class Arch, typename IdT>
__global__ void __launch_bounds__(kRoutingThreads) moe_place_kernel(const __grid_constant__ RoutingProblem p) {
  __shared__ int64_t partial[kRoutingWarps];
  __shared__ int32_t warp_totals[kRoutingWarps];
  const int32_t e = blockIdx.x;  // == p.experts: the block of dropped slots and trailing rows
  const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const Run run = warp_run(all_slots(p));

  // Wait for the count kernel
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // First row of this expert: the aligned counts of the experts before it
  int64_t before = 0;
  for (int32_t i = threadIdx.x; i < e; i += kRoutingThreads) before += aligned_count(p, i);
  const int64_t first_row = block_reduce<kRoutingWarps, true>(before, SumOp{}, partial);

  if (e == p.experts) {
    // Dropped slots; rows past M_sum; the bound on M_sum
    for_each_step<IdT>(p, run, [&](int32_t s, int64_t x) {
      if (x == -1) drop_slot(p, s);
    });
    for (int64_t r = first_row + threadIdx.x; r < p.rows; r += kRoutingThreads) {
      p.m_indices[r] = -1;
      p.row_token[r] = -1;
    }
    if (threadIdx.x == 0) {
      p.row_offsets[p.experts] = clamp_row(first_row);
      if (first_row > p.rows) atomicOr(p.status, FP8QUANT_ROUTING_ROWS_OVERFLOW);
    }
    return;
  }
  if (threadIdx.x == 0) p.row_offsets[e] = clamp_row(first_row);

  // Rank of the run's first slot of this expert: its slots in the runs before
  int32_t mine = 0;
  for_each_step<IdT>(p, run, [&](int32_t, int64_t x) { mine += x == e; });
  mine = warp_reduce<32>(mine, SumOp{});
  if (lane == 0) warp_totals[warp] = mine;
  __syncthreads();
  int64_t rank = 0;
  for (int w = 0; w < warp; ++w) rank += warp_totals[w];

  // Place the run's slots of this expert in order: each step's hits ranked by a ballot
  bool rows_overflow = false, max_m_overflow = false;
  for_each_step<IdT>(p, run, [&](int32_t s, int64_t x) {
    const bool hit = x == e;
    const unsigned ballot = __ballot_sync(kFullMask, hit);
    if (hit) place_slot(p, s, e, first_row, rank + __popc(ballot & ((1u << lane) - 1u)), rows_overflow, max_m_overflow);
    rank += __popc(ballot);
  });
  if (rows_overflow) atomicOr(p.status, FP8QUANT_ROUTING_ROWS_OVERFLOW);
  if (max_m_overflow) atomicOr(p.status, FP8QUANT_ROUTING_MAX_M_OVERFLOW);

  // Padding rows of this expert
  const int64_t count = p.counts[e];
  const int64_t end = min(first_row + aligned_count(p, e), int64_t{p.rows});
  for (int64_t r = first_row + count + threadIdx.x; r < end; r += kRoutingThreads) {
    p.m_indices[r] = -1;
    p.row_token[r] = -1;
  }
}

// --- Pieces of the one-kernel and chunk routings (up to kOneKernelExperts experts) ------------

// Dynamic shared memory of the per-run counts, kRoutingWarps x experts.
inline size_t routing_counts_bytes(const RoutingProblem& p) {
  return size_t{kRoutingWarps} * static_cast<size_t>(p.experts) * sizeof(uint32_t);
}

// The shared arrays of a routing block: the per-run counts (dynamic shared memory; none in the
// chunk scan), the experts' first rows ([experts]: M_sum) and their counts.
struct PlacementSmem {
  uint32_t* run_counts;  // [kRoutingWarps][experts]: per run; after the scan, the expert's slots before the run
  int64_t* first;        // [experts + 1]
  int32_t* count;        // [experts]
};

// The lanes of the warp whose expert equals x (x in [kNoSlot, kOneKernelExperts)): one ballot
// per bit of x - kNoSlot.
__device__ __forceinline__ unsigned lanes_with_expert(int64_t x) {
  constexpr int kBits = 10;
  static_assert(kOneKernelExperts - kNoSlot <= (1 << kBits), "every expert and both marks fit the key");
  const uint32_t key = static_cast<uint32_t>(x - kNoSlot);
  unsigned peers = kFullMask;
#pragma unroll
  for (int bit = 0; bit < kBits; ++bit) {
    const bool set = key >> bit & 1u;
    const unsigned lanes = __ballot_sync(kFullMask, set);
    peers &= set ? lanes : ~lanes;
  }
  return peers;
}

// Zero this warp's per-run counts, if its run holds slots (shared memory only: before the wait).
__device__ __forceinline__ void zero_run_counts(const RoutingProblem& p, uint32_t* mine, int32_t runs) {
  if (static_cast<int32_t>(threadIdx.x / 32) < runs) {
    for (int32_t e = threadIdx.x % 32; e < p.experts; e += 32) mine[e] = 0;
  }
  __syncwarp();
}

// Count the run's slots per expert into this warp's counts (shared atomics).
template <typename IdT>
__device__ __forceinline__ void count_run(const RoutingProblem& p, Run run, uint32_t* mine) {
  for_each_step<IdT>(p, run, [&](int32_t, int64_t x) {
    if (x >= 0) atomicAdd(&mine[x], 1u);
  });
}

// Per expert e, replace each run's count by the expert's slots before the run, starting from
// before(e); total(e, sum) gets the sum past the last run. After the runs are counted (a barrier).
template <class Before, class Total>
__device__ __forceinline__ void scan_runs(const RoutingProblem& p, uint32_t* run_counts, int32_t runs, Before&& before,
                                          Total&& total) {
  for (int32_t e = threadIdx.x; e < p.experts; e += kRoutingThreads) {
    uint32_t sum = before(e);
    for (int w = 0; w < runs; ++w) {
      const uint32_t c = run_counts[w * p.experts + e];
      run_counts[w * p.experts + e] = sum;
      sum += c;
    }
    total(e, sum);
  }
}

// The first rows' scan: M_sum, and the status its bounds give.
struct FirstRows {
  int64_t m_sum;
  int32_t status;
};

// Scan the aligned counts into the first rows (one expert per thread; smem.count complete: a
// barrier before), and with `store` write the counts, the first rows and (kStoreStatus) the
// status. Every thread calls it (it has barriers).
template <bool kStoreStatus = true>
__device__ __forceinline__ FirstRows scan_first_rows(const RoutingProblem& p, PlacementSmem smem, int64_t* warp_sums,
                                                     bool store) {
  const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t e = threadIdx.x;
  int64_t rows_through = e < p.experts ? (int64_t{smem.count[e]} + p.align - 1) / p.align * p.align : 0;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int64_t v = __shfl_up_sync(kFullMask, rows_through, offset);
    if (lane >= offset) rows_through += v;
  }
  if (lane == 31) warp_sums[warp] = rows_through;
  __syncthreads();
  if (e < p.experts) {
    for (int w = 0; w < warp; ++w) rows_through += warp_sums[w];
    smem.first[e + 1] = rows_through;
  }
  if (e == 0) smem.first[0] = 0;
  const bool max_m_overflow = __syncthreads_or(p.masked_row != nullptr && e < p.experts && smem.count[e] > p.max_m);
  const int64_t m_sum = smem.first[p.experts];
  const int32_t status =
      (m_sum > p.rows ? FP8QUANT_ROUTING_ROWS_OVERFLOW : 0) | (max_m_overflow ? FP8QUANT_ROUTING_MAX_M_OVERFLOW : 0);
  if (store) {
    if (e < p.experts) {
      p.counts[e] = smem.count[e];
      p.row_offsets[e] = clamp_row(smem.first[e]);
    }
    if (e == 0) {
      p.row_offsets[p.experts] = clamp_row(m_sum);
      if (kStoreStatus) *p.status = status;
    }
  }
  return {m_sum, status};
}

// Place the run's slots in order, ranked from the warp's counts of the slots before the run
// (`earlier`, advanced as it goes). The bounds' status bits come from scan_first_rows, which
// every routing stores (or hands to the chunk barrier), not from here.
template <typename IdT>
__device__ __forceinline__ void place_run(const RoutingProblem& p, Run run, PlacementSmem smem, uint32_t* earlier) {
  const int32_t lane = threadIdx.x % 32;
  const unsigned lanes_before = (1u << lane) - 1u;
  bool rows_overflow = false, max_m_overflow = false;  // (unread: the status comes from scan_first_rows)
  for_each_step<IdT>(p, run, [&](int32_t s, int64_t x) {
    const unsigned peers = lanes_with_expert(x);
    if (x >= 0) {
      place_slot(p, s, static_cast<int32_t>(x), smem.first[x], int64_t{earlier[x]} + __popc(peers & lanes_before),
                 rows_overflow, max_m_overflow);
    } else if (x == -1) {
      drop_slot(p, s);
    }
    __syncwarp();
    if (x >= 0 && lane == __ffs(peers) - 1) earlier[x] += __popc(peers);
    __syncwarp();
  });
}

// Mark the rows that hold no token, this block's share: the padding rows of each expert (one warp
// an expert, the experts dealt round robin to the warps of all blocks), and this block's slice of
// the rows past M_sum.
__device__ __forceinline__ void mark_rows_without_token(const RoutingProblem& p, PlacementSmem smem, int64_t m_sum) {
  const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int32_t x = blockIdx.x * kRoutingWarps + warp; x < p.experts; x += gridDim.x * kRoutingWarps) {
    const int64_t end = min(smem.first[x + 1], int64_t{p.rows});
    for (int64_t r = smem.first[x] + smem.count[x] + lane; r < end; r += 32) {
      p.m_indices[r] = -1;
      p.row_token[r] = -1;
    }
  }
  const uint32_t tail = static_cast<uint32_t>(max(int64_t{p.rows} - m_sum, int64_t{0}));
  const int64_t slice = (tail + gridDim.x - 1) / gridDim.x;  // 32-bit: rows fit int32
  const int64_t tail_end = min(m_sum + (blockIdx.x + 1) * slice, int64_t{p.rows});
  for (int64_t r = m_sum + blockIdx.x * slice + threadIdx.x; r < tail_end; r += kRoutingThreads) {
    p.m_indices[r] = -1;
    p.row_token[r] = -1;
  }
}

// --- The one kernel ---------------------------------------------------------------------------

template <class Arch, typename IdT>
__global__ void __launch_bounds__(kRoutingThreads) moe_route_kernel(const __grid_constant__ RoutingProblem p) {
  extern __shared__ uint32_t run_counts[];
  __shared__ int64_t first[kOneKernelExperts + 1];
  __shared__ int32_t count[kOneKernelExperts];
  __shared__ int64_t warp_sums[kRoutingWarps];
  const PlacementSmem smem{run_counts, first, count};
  const int32_t warp = threadIdx.x / 32;
  const Run run = warp_run(all_slots(p));
  const int32_t runs = nonempty_runs(all_slots(p));
  uint32_t* const earlier = run_counts + warp * p.experts;  // this warp's run
  zero_run_counts(p, earlier, runs);

  // Wait for the previous kernel's writes; let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Count each run's slots per expert; count each expert, and per run keep its slots in the runs
  // before
  count_run<IdT>(p, run, earlier);
  __syncthreads();
  scan_runs(p, run_counts, runs, [](int32_t) { return 0u; }, [&](int32_t e, uint32_t total) { count[e] = total; });
  __syncthreads();

  // First rows; counts, first rows and status (block 0)
  const int64_t m_sum = scan_first_rows(p, smem, warp_sums, blockIdx.x == 0).m_sum;

  // Place the slots of the runs this block owns; mark its share of the rows without a token
  if (warp % gridDim.x == blockIdx.x) place_run<IdT>(p, run, smem, earlier);
  mark_rows_without_token(p, smem, m_sum);
}

// --- The chunk kernels ------------------------------------------------------------------------

// Chunk c's counts per expert, in its first slots of inv_perm (after the chunk scan: the slots of
// each expert in the chunks before c).
__device__ __forceinline__ int32_t* chunk_counts(const RoutingProblem& p, int32_t c) {
  return p.inv_perm + int64_t{c} * routing_chunk_slots(p.slots);
}

// Thread (part j, expert e) of a block that sums the chunk counts takes expert e's counts in
// chunks [j * chunks / parts, (j + 1) * chunks / parts): at least two parts an expert.
struct ChunkPart {
  int32_t e, part, parts, begin, end;
  bool active;
};
__device__ __forceinline__ ChunkPart chunk_part(const RoutingProblem& p) {
  ChunkPart c;
  const int32_t chunks = routing_chunks(p.slots);
  c.parts = kRoutingThreads / p.experts;
  c.e = static_cast<int32_t>(threadIdx.x) % p.experts;
  c.part = static_cast<int32_t>(threadIdx.x) / p.experts;
  c.begin = static_cast<int32_t>(int64_t{c.part} * chunks / c.parts);
  c.end = static_cast<int32_t>(int64_t{c.part + 1} * chunks / c.parts);
  c.active = c.part < c.parts;
  return c;
}

// The barrier of the two-kernel chunk routing's blocks (co-resident: a cooperative launch), on
// the status word, which the chunk count zeroes: each block arrives once it has read what the
// others will overwrite, waits until all have arrived, and leaves; the last to leave stores the
// status. One thread a block calls each.
__device__ __forceinline__ void arrive_at_chunk_barrier(int32_t* word) {
  __threadfence();  // this block's reads before the arrival, for the blocks that wait on it
  atomicAdd(word, 1);
}
__device__ __forceinline__ void pass_chunk_barrier(int32_t* word, int32_t status) {
  const int32_t blocks = static_cast<int32_t>(gridDim.x);
  for (int32_t arrived = 0;;) {
    asm volatile("ld.acquire.gpu.b32 %0, [%1];" : "=r"(arrived) : "l"(word) : "memory");
    if (arrived >= blocks) break;
    __nanosleep(32);  // the arrivals land on this line too
  }
  if (atomicAdd(word, 1) == 2 * blocks - 1) atomicExch(word, status);  // none waits any more
}

template <class Arch, typename IdT>
__global__ void __launch_bounds__(kRoutingThreads) moe_chunk_count_kernel(const __grid_constant__ RoutingProblem p) {
  __shared__ uint32_t count[kOneKernelExperts];
  const Run chunk = routing_chunk(p, blockIdx.x);
  for (int32_t e = threadIdx.x; e < p.experts; e += kRoutingThreads) count[e] = 0;
  __syncthreads();

  // Wait for the previous kernel's writes; let the chunk placement (or scan) launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Count the chunk's slots per expert (shared atomics); store the counts; zero the status word
  // (the two-kernel placement's barrier)
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.status = 0;
  for (int32_t s = chunk.begin + threadIdx.x; s < chunk.end; s += kRoutingThreads) {
    const int64_t x = local_expert<IdT>(p, s);
    if (x >= 0) atomicAdd(&count[x], 1u);
  }
  __syncthreads();
  int32_t* const counts = chunk_counts(p, blockIdx.x);
  for (int32_t e = threadIdx.x; e < p.experts; e += kRoutingThreads) counts[e] = static_cast<int32_t>(count[e]);
}

template <class Arch>
__global__ void __launch_bounds__(kRoutingThreads) moe_chunk_scan_kernel(const __grid_constant__ RoutingProblem p) {
  __shared__ uint32_t part_sums[kRoutingThreads];  // [parts][experts]
  __shared__ int64_t first[kOneKernelExperts + 1];
  __shared__ int32_t count[kOneKernelExperts];
  __shared__ int64_t warp_sums[kRoutingWarps];
  const ChunkPart cp = chunk_part(p);

  // Wait for the chunk counts; let the chunk placement launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Sum this part's chunk counts
  uint32_t sum = 0;
  if (cp.active) {
#pragma unroll 4
    for (int32_t c = cp.begin; c < cp.end; ++c) sum += static_cast<uint32_t>(chunk_counts(p, c)[cp.e]);
    part_sums[threadIdx.x] = sum;
  }
  __syncthreads();

  // Count each expert; each chunk's counts become the expert's slots in the chunks before it
  if (cp.active) {
    uint32_t before = 0, total = 0;
    for (int32_t j = 0; j < cp.parts; ++j) {
      const uint32_t c = part_sums[j * p.experts + cp.e];
      before += j < cp.part ? c : 0u;
      total += c;
    }
    if (cp.part == 0) count[cp.e] = static_cast<int32_t>(total);
    constexpr int kBatch = 8;  // loads in flight
    for (int32_t c0 = cp.begin; c0 < cp.end; c0 += kBatch) {
      uint32_t mine[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        mine[i] = c0 + i < cp.end ? static_cast<uint32_t>(chunk_counts(p, c0 + i)[cp.e]) : 0u;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (c0 + i < cp.end) chunk_counts(p, c0 + i)[cp.e] = static_cast<int32_t>(before);
        before += mine[i];
      }
    }
  }
  __syncthreads();

  // First rows; counts, first rows and status
  scan_first_rows(p, PlacementSmem{nullptr, first, count}, warp_sums, true);
}

// The placement's static shared memory, which with kDefaultMaxDynamicSmem of run counts stays
// within the default 48 KiB.
template <bool kScan>
struct ChunkPlaceShared {
  int64_t first[kOneKernelExperts + 1];
  int32_t count[kOneKernelExperts];
  uint32_t part_sums[kScan ? 2 * kRoutingThreads : 1];  // [before, all][parts][experts]
  int64_t warp_sums[kScan ? kRoutingWarps : 1];
};
static_assert(sizeof(ChunkPlaceShared<true>) + kDefaultMaxDynamicSmem <= 48 * 1024,
              "the placement fits without opting in");

// kScan: the two-kernel chunk routing, without the chunk scan. Every block sums the chunk counts
// itself (all chunks', and those of the chunks before its own) and scans the first rows; block 0
// stores the counts and first rows. The placement overwrites the chunk counts in inv_perm, so the
// blocks meet at a barrier first (pass_chunk_barrier): they are co-resident, and each arrives as
// soon as its reads are done.
template <class Arch, typename IdT, bool kScan>
__global__ void __launch_bounds__(kRoutingThreads) moe_chunk_place_kernel(const __grid_constant__ RoutingProblem p) {
  extern __shared__ uint32_t run_counts[];
  __shared__ ChunkPlaceShared<kScan> shared;
  auto& first = shared.first;
  auto& count = shared.count;
  auto& part_sums = shared.part_sums;
  auto& warp_sums = shared.warp_sums;
  const PlacementSmem smem{run_counts, first, count};
  const Run chunk = routing_chunk(p, blockIdx.x);
  const Run run = warp_run(chunk);
  const int32_t runs = nonempty_runs(chunk);
  uint32_t* const earlier = run_counts + threadIdx.x / 32 * p.experts;  // this warp's run
  zero_run_counts(p, earlier, runs);

  // Wait for the chunk scan (kScan: the chunk count); let the next kernel launch
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  // Count each run's slots per expert
  count_run<IdT>(p, run, earlier);
  if constexpr (kScan) {
    // Sum this part's chunk counts: those of the chunks before this block's, and all
    const ChunkPart cp = chunk_part(p);
    if (cp.active) {
      uint32_t before = 0, all = 0;
#pragma unroll 4
      for (int32_t c = cp.begin; c < cp.end; ++c) {
        const uint32_t n = static_cast<uint32_t>(__ldcg(chunk_counts(p, c) + cp.e));
        before += c < static_cast<int32_t>(blockIdx.x) ? n : 0u;
        all += n;
      }
      part_sums[threadIdx.x] = before;
      part_sums[kRoutingThreads + threadIdx.x] = all;
    }
    __syncthreads();
    if (threadIdx.x == 0) arrive_at_chunk_barrier(p.status);

    // Count each expert; per run, the expert's slots before it: in the chunks before, then in
    // the runs before
    const auto sum_parts = [&](int32_t e, int32_t half) {
      uint32_t sum = 0;
      for (int32_t j = 0; j < cp.parts; ++j) sum += part_sums[half * kRoutingThreads + j * p.experts + e];
      return sum;
    };
    for (int32_t e = threadIdx.x; e < p.experts; e += kRoutingThreads) count[e] = static_cast<int32_t>(sum_parts(e, 1));
    scan_runs(p, run_counts, runs, [&](int32_t e) { return sum_parts(e, 0); }, [](int32_t, uint32_t) {});
  } else {
    // The experts' first rows and counts
    for (int32_t e = threadIdx.x; e <= p.experts; e += kRoutingThreads) {
      first[e] = p.row_offsets[e];  // clamped to int32 past the rows: places and marks nothing there either
      if (e < p.experts) count[e] = p.counts[e];
    }
    __syncthreads();

    // Per run, the expert's slots before it: in the chunks before, then in the runs before. Read
    // the chunk's counts before any placement overwrites them (a barrier)
    const int32_t* const chunks_before = chunk_counts(p, blockIdx.x);
    scan_runs(
        p, run_counts, runs, [&](int32_t e) { return static_cast<uint32_t>(chunks_before[e]); },
        [](int32_t, uint32_t) {});
  }
  __syncthreads();

  int64_t m_sum;
  if constexpr (kScan) {
    // First rows (block 0: counts and first rows); wait for every block's reads of the chunk
    // counts
    const FirstRows rows = scan_first_rows<false>(p, smem, warp_sums, blockIdx.x == 0);
    m_sum = rows.m_sum;
    if (threadIdx.x == 0) pass_chunk_barrier(p.status, rows.status);
    __syncthreads();
  } else {
    m_sum = first[p.experts];
  }

  // Place the run's slots; mark this block's share of the rows without a token
  place_run<IdT>(p, run, smem, earlier);
  mark_rows_without_token(p, smem, m_sum);
}

// Let `kernel` take the per-run counts of `problem` in dynamic shared memory: past the default
// limit, opt in, on the current device (so at every launch), to the most any launch takes (so that
// no other thread's launch lowers it between this one's two calls).
template <class Kernel>
fp8quant_status_t allow_run_counts(Kernel kernel, const RoutingProblem& problem) {
  if (routing_counts_bytes(problem) <= kDefaultMaxDynamicSmem) return FP8QUANT_SUCCESS;
  constexpr int kMaxSmem = kRoutingWarps * kOneKernelExperts * sizeof(uint32_t);
  return cuda_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem),
                    "cudaFuncSetAttribute");
}

// Launch the routing kernels for `problem` on `stream`.
template <class Arch>
fp8quant_status_t launch_moe_routing(const RoutingProblem& problem, cudaStream_t stream) {
  return FP8QUANT_DISPATCH_BOOL(problem.int64_ids, kInt64, [&] {
    using IdT = std::conditional_t<kInt64, int64_t, int32_t>;
    const auto launch = [&](auto kernel, int64_t blocks, size_t smem = 0) {
      return cuda_error(launch_with_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kRoutingThreads), stream,
                                        problem, problem.pdl, smem),
                        "kernel launch");
    };
    const size_t run_counts = routing_counts_bytes(problem);
    const RoutingShape shape = routing_shape(problem);
    if (shape == RoutingShape::kOneKernel) {
      const auto kernel = moe_route_kernel<Arch, IdT>;
      const int64_t blocks = std::clamp<int64_t>(
          (int64_t{problem.rows} + kOneKernelRowsPerBlock - 1) / kOneKernelRowsPerBlock, 1, kOneKernelMaxBlocks);
      FP8QUANT_RETURN_IF_ERROR(allow_run_counts(kernel, problem));
      return launch(kernel, blocks, run_counts);
    }
    if (shape == RoutingShape::kChunks) {
      // Two kernels where the GPU holds every chunk's block at once (by the occupancy, and then
      // by the cooperative launch's own check), else three; any other launch error is returned.
      // The occupancy is asked without the run counts' dynamic shared memory (it is asked once a
      // kernel), which does not bind on sm_90 and sm_100: at most two 1024-thread blocks fit an
      // SM, and two with the largest run counts take about 160 KiB of its 228; were it to bind,
      // the launch's own check would still fall back
      const int32_t chunks = routing_chunks(problem.slots);
      constexpr auto place_scan = moe_chunk_place_kernel<Arch, IdT, true>;
      constexpr auto place = moe_chunk_place_kernel<Arch, IdT, false>;
      FP8QUANT_RETURN_IF_ERROR(allow_run_counts(place_scan, problem));
      FP8QUANT_RETURN_IF_ERROR(allow_run_counts(place, problem));
      FP8QUANT_RETURN_IF_ERROR(launch(moe_chunk_count_kernel<Arch, IdT>, chunks));
      const int64_t resident = int64_t{problem.sm_count} * resident_blocks_per_sm<place_scan, kRoutingThreads>();
      if (problem.cooperative && chunks <= resident) {
        const cudaError_t err = launch_with_pdl(place_scan, dim3(static_cast<unsigned>(chunks)), dim3(kRoutingThreads),
                                                stream, problem, problem.pdl, run_counts, /*cooperative=*/true);
        if (err != cudaErrorCooperativeLaunchTooLarge) return cuda_error(err, "kernel launch");
      }
      FP8QUANT_RETURN_IF_ERROR(launch(moe_chunk_scan_kernel<Arch>, 1));
      return launch(place, chunks, run_counts);
    }
    FP8QUANT_RETURN_IF_ERROR(launch(moe_count_kernel<Arch, IdT>, problem.experts));
    return launch(moe_place_kernel<Arch, IdT>, problem.experts + 1);
  });
}

}  // namespace fp8quant::kernels
