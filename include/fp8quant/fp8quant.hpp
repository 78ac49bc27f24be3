/**
 * @file fp8quant.hpp
 * @brief C++17 convenience layer over the fp8quant C API: exceptions instead of statuses, and a
 *        short form for the common contiguous 2-D case. Header-only; link fp8quant::fp8quant.
 */
#ifndef FP8QUANT_FP8QUANT_HPP_
#define FP8QUANT_FP8QUANT_HPP_

#include <stdexcept>
#include <string>

#include "fp8quant/fp8quant.h"

namespace fp8quant {

/** @brief A failed fp8quant call: its status and the library's message. */
class Error : public std::runtime_error {
 public:
  Error(fp8quant_status_t status, const std::string& message)
      : std::runtime_error(std::string(fp8quant_status_string(status)) + ": " + message), status_(status) {}

  /** @brief The status the C API returned. */
  fp8quant_status_t status() const noexcept { return status_; }

 private:
  fp8quant_status_t status_;
};

/** @brief Throw fp8quant::Error unless `status` is FP8QUANT_SUCCESS. */
inline void check(fp8quant_status_t status) {
  if (status != FP8QUANT_SUCCESS) throw Error(status, fp8quant_last_error());
}

/** @brief fp8quant_scale_shape(), throwing on bad arguments. */
inline fp8quant_scale_shape_t scale_shape(fp8quant_scale_layout_t layout, int64_t batch, int64_t m,
                                          int64_t num_groups) {
  fp8quant_scale_shape_t shape{};
  check(fp8quant_scale_shape(layout, batch, m, num_groups, &shape));
  return shape;
}

/**
 * @brief Quantize a contiguous `x [m, k]` into a contiguous `q [m, k]` and `scale` (see
 *        fp8quant_per_token_group_quant() for every argument and the strided, batched form;
 *        `eps` must be finite and at least `FLT_MIN`).
 */
inline void per_token_group_quant(const void* x, fp8quant_dtype_t x_dtype, int64_t m, int64_t k, void* q, void* scale,
                                  fp8quant_scale_layout_t scale_layout, int64_t group_size = 128, bool ue8m0 = false,
                                  float eps = 1e-10f, cudaStream_t stream = nullptr) {
  check(fp8quant_per_token_group_quant(x, x_dtype, 1, m, k, 0, k, q, 0, k, scale, scale_layout, ue8m0 ? 1 : 0,
                                       group_size, eps, stream));
}

/** @brief fp8quant_set_pdl(): turn programmatic dependent launch on or off; returns the previous setting. */
inline bool set_pdl(bool enabled) { return fp8quant_set_pdl(enabled ? 1 : 0) != 0; }

/** @brief Whether kernels launch with programmatic dependent launch. */
inline bool pdl_enabled() { return fp8quant_pdl_enabled() != 0; }

}  // namespace fp8quant

#endif  // FP8QUANT_FP8QUANT_HPP_
