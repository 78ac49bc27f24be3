// Host-side description of one block-scaled quantization (MXFP8 or NVFP4), validated by the C
// API and handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
#include "common/fast_divisor.hpp"
#include "common/scale_order.hpp"
#include "fp8quant/mx.h"
#include "kernels/moe_source.hpp"

namespace fp8quant {

constexpr int kMxGroup = 32;     // elements per MXFP8 group
constexpr int kNvfp4Group = 16;  // elements per NVFP4 group

// Teams of threads (16 elements each: two a group for MXFP8, one for NVFP4) take one scale slot
// (row r, group slot c) each, row after row: rows [0, rows) and slots [0, slots) of each batch,
// where rows and slots are m and num_groups (row layout) or their swizzled paddings
// round_up(m, 128) and round_up(num_groups, 4), whose slots hold zero bytes.
struct BlockScaledProblem : MoeSource {
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
  const float* global_scale;  // NVFP4: the encode scales, on the device
  int32_t global_scales;      // NVFP4: how many (1: one for all; else one per batch or expert)
  bool aligned;               // x and q pointers and strides allow 16-byte accesses
  bool pdl;                   // launch with programmatic dependent launch (fp8quant_set_pdl)

  // The MoE sources (MoeSource, the base): kSiluMul, and kScatter for NVFP4, whose encode scale
  // is each slot's expert's; and the SiLU source's per-expert encode scales
  const int32_t* row_experts;       // kScatter, contiguous: the expert of each destination row (m_indices)
  bool global_scale_by_row_expert;  // NVFP4, contiguous kSiluMul: row r's encode scale is global_scale[row_map[r]]

  // NVFP4's plain rows go in chunks, a warp each, in launches past one wave of the device's
  // threads (block_scaled_quant.cuh); the launcher sets the chunks' fields
  int32_t chunks;          // chunks a row: slots / kChunkSlots, rounded up
  int32_t chunk_units;     // rows * chunks: the warps of one batch
  FastDivisor row_chunks;  // chunks
  int32_t sm_count;        // streaming multiprocessors of the device
};

FP8QUANT_DECLARE_ARCH_ENTRIES(block_scaled_quant, BlockScaledProblem)

}  // namespace fp8quant
