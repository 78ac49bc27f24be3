/**
 * @file fp8quant.h
 * @brief Umbrella header of the fp8quant C API (C++ users may include fp8quant.hpp instead).
 */
#ifndef FP8QUANT_FP8QUANT_H_
#define FP8QUANT_FP8QUANT_H_

#include "fp8quant/common.h"
#include "fp8quant/moe.h"
#include "fp8quant/mx.h"
#include "fp8quant/norm.h"
#include "fp8quant/pack.h"
#include "fp8quant/quant.h"
#include "fp8quant/weights.h"

#endif  // FP8QUANT_FP8QUANT_H_
