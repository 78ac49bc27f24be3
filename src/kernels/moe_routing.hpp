// Host-side description of one MoE routing (docs/contract.md, "MoE"), validated by the C API and
// handed to the launcher of the device's architecture.
#pragma once

#include <cstdint>

#include "common/arch.hpp"
#include "fp8quant/common.h"

namespace fp8quant {

struct RoutingProblem {
  const void* topk_ids;  // [t * k] in flat slot order
  int32_t* counts;       // [experts]
  int32_t* row_offsets;  // [experts + 1]
  int32_t* m_indices;    // [rows]
  int32_t* row_token;    // [rows]
  int32_t* inv_perm;     // [slots]
  int32_t* masked_row;   // [slots], null when max_m == 0
  int32_t* status;       // [1]: fp8quant_routing_status_t bits
  int64_t expert_offset;
  int32_t slots;  // t * k
  int32_t k;
  int32_t experts;  // grid.x of the count kernel; the placement kernel has one more block
  int32_t align;
  int32_t rows;
  int32_t max_m;
  bool int64_ids;
  int32_t sm_count;  // streaming multiprocessors of the device
  bool pdl;          // launch with programmatic dependent launch (fp8quant_set_pdl)
  bool cooperative;  // the chunk routing may launch its placement cooperatively (FP8QUANT_COOPERATIVE)
};

FP8QUANT_DECLARE_ARCH_ENTRIES(moe_routing, RoutingProblem)

}  // namespace fp8quant
