// Host-side description of one block-scaled quantization (MXFP8 or NVFP4), validated by the C
// API and handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
#include "common/fast_divisor.hpp"
#include "common/scale_order.hpp"
#include "fp8quant/mx.h"

namespace fp8quant {

constexpr int kMxGroup = 32;     // elements per MXFP8 group
constexpr int kNvfp4Group = 16;  // elements per NVFP4 group

// Teams of threads (16 elements each: two a group for MXFP8, one for NVFP4) take one scale slot
// (row r, group slot c) each, row after row: rows [0, rows) and slots [0, slots) of each batch,
// where rows and slots are m and num_groups (row layout) or their swizzled paddings
// round_up(m, 128) and round_up(num_groups, 4), whose slots hold zero bytes.
struct BlockScaledProblem {
  const void* x;
  void* q;
  uint8_t* scale;
  int64_t x_batch_stride;      // elements
  int64_t x_row_stride;        // elements
  int64_t q_batch_stride;      // bytes
  int64_t q_row_stride;        // bytes (k for MXFP8, k / 2 for NVFP4 a row at least)
  int64_t scale_batch_stride;  // bytes: rows * slots
  int32_t batch;
  int32_t m;
  int32_t num_groups;
  int32_t rows;
  int32_t slots;
  int32_t units;          // rows * slots: the teams of one batch
  FastDivisor row_slots;  // slots
  fp8quant_dtype_t dtype;
  fp8quant_mx_scale_layout_t layout;
  BlockFormat format;
  const float* global_scale;    // NVFP4: the encode scale of each batch (or of all), on the device
  int64_t global_scale_stride;  // NVFP4: floats between batches' encode scales (0: one for all)
  bool aligned;                 // x and q pointers and strides allow 16-byte accesses
  bool pdl;                     // launch with programmatic dependent launch (fp8quant_set_pdl)

  // MoE sources (kRows reads x's rows), with the MoE layouts' rows as QuantProblem's
  // (moe_rows.cuh):
  //   kSiluMul  q row r is silu(gate) * up of x's row r [gate | up];
  //   kScatter  (NVFP4) teams walk x's rows (tokens): token t's row is quantized with the encode
  //             scale of each of its slots' experts and stored at the slot's flat destination row
  //             row_map[t * slots_per_row + j] ([dest_batch, dest_m] rows; -1 or past them:
  //             dropped); then pad_chunks blocks per expert zero the scale bytes of its tile
  //             padding (moe_rows.cuh: tile_padding).
  QuantSource source;
  int64_t up_offset;                // kSiluMul: elements from a row's gate half to its up half
  const int32_t* row_map;           // kSiluMul: m_indices, or null; kScatter: the slots' rows [tokens, slots_per_row]
  const int32_t* row_counts;        // live rows of each batch (kSiluMul, masked) or expert (kScatter), or null
  const int32_t* row_starts;        // kScatter, contiguous: each expert's first row [experts + 1], or null
  const int32_t* used_rows;         // kSiluMul, contiguous: rows at or past *used_rows are untouched, or null
  const int32_t* row_experts;       // kScatter, contiguous: the expert of each destination row (m_indices)
  int32_t pad_align;                // masked layouts: rows per tile
  int32_t slots_per_row;            // kScatter: slots per token (k)
  int32_t experts;                  // kScatter: experts whose tile padding the last blocks zero
  int32_t dest_batch;               // kScatter: batches of q and the scales (1, or experts when masked)
  int32_t dest_m;                   // kScatter: rows per destination batch
  int32_t dest_rows;                // kScatter: scale layout rows per destination batch (dest_m, or padded)
  int32_t token_blocks;             // kScatter: blocks of the token part (set by the launcher)
  int32_t pad_chunks;               // kScatter: padding blocks per expert (set by the launcher)
  bool global_scale_by_row_expert;  // NVFP4, contiguous kSiluMul: row r's encode scale is global_scale[row_map[r]]
};

FP8QUANT_DECLARE_ARCH_ENTRIES(block_scaled_quant, BlockScaledProblem)

}  // namespace fp8quant
