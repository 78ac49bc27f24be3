/**
 * @file common.h
 * @brief Status codes, element types and library-wide queries of the fp8quant C API.
 *
 * Every fp8quant function returns an ::fp8quant_status_t. On failure,
 * fp8quant_last_error() returns a message that names the offending argument; it is kept per
 * thread until the next failing call on that thread. A call refused by validation launches
 * nothing; one that fails at a launch may have launched the kernels before it (an operation of
 * several kernels), so the contents of its outputs are then unspecified.
 *
 * Validation follows one rule in every function. Every value (dtypes, layouts and the other
 * enums, sizes, eps, strides) is checked on every call, an empty one included. A pointer is
 * checked (non-null, aligned, apart from the others) only where the call reads or writes through
 * it: a call with nothing to do (no rows, batches or tokens: nothing is launched) examines none,
 * so any of them may be null, and so may a buffer of zero bytes. The stride of a dimension of
 * size 0 or 1 is never used and may hold any value.
 */
#ifndef FP8QUANT_COMMON_H_
#define FP8QUANT_COMMON_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#if defined(_WIN32)
#define FP8QUANT_API __declspec(dllexport)
#else
#define FP8QUANT_API __attribute__((visibility("default")))
#endif

#define FP8QUANT_VERSION_MAJOR 0
#define FP8QUANT_VERSION_MINOR 1
#define FP8QUANT_VERSION_PATCH 0

/**
 * The underlying type of every public enum in C++: `int`, fixed, so that any int (an unknown
 * value, which the functions refuse, included) is a value of the enum type. C keeps its own enum
 * types, of the same size.
 */
#ifdef __cplusplus
#define FP8QUANT_ENUM_BASE : int
#else
#define FP8QUANT_ENUM_BASE
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** @brief Result of every fp8quant call. */
typedef enum fp8quant_status FP8QUANT_ENUM_BASE {
  FP8QUANT_SUCCESS = 0,                  /**< The work was enqueued on the stream. */
  FP8QUANT_ERROR_INVALID_ARGUMENT = 1,   /**< An argument is wrong; nothing was launched. */
  FP8QUANT_ERROR_NO_DEVICE = 2,          /**< No CUDA device (or no driver) is available. */
  FP8QUANT_ERROR_UNSUPPORTED_DEVICE = 3, /**< The current device is neither compute capability 9.0 nor 10.x. */
  FP8QUANT_ERROR_CUDA = 4,               /**< The CUDA runtime reported an error. */
} fp8quant_status_t;

/** @brief Element type of an input tensor. */
typedef enum fp8quant_dtype FP8QUANT_ENUM_BASE {
  FP8QUANT_DTYPE_FLOAT32 = 0,
  FP8QUANT_DTYPE_FLOAT16 = 1,
  FP8QUANT_DTYPE_BFLOAT16 = 2,
} fp8quant_dtype_t;

/** @brief Library version as `major * 10000 + minor * 100 + patch`. */
FP8QUANT_API int fp8quant_version(void);

/** @brief A static, human-readable name for a status code. */
FP8QUANT_API const char* fp8quant_status_string(fp8quant_status_t status);

/**
 * @brief Details of the last failing fp8quant call on the calling thread.
 *
 * The string stays valid until the next fp8quant call on the same thread; it is empty if no
 * call has failed yet.
 */
FP8QUANT_API const char* fp8quant_last_error(void);

/**
 * @brief Version of the CUDA toolkit the library was built with, as `CUDART_VERSION`
 * (`major * 1000 + minor * 10`: 13000 for CUDA 13.0). Its major version sets the oldest
 * NVIDIA driver the library runs on.
 */
FP8QUANT_API int fp8quant_cuda_version(void);

/**
 * @brief Whether the calling thread's current CUDA device can run fp8quant's kernels.
 *
 * @param[out] major, minor  The device's compute capability, where not null (left untouched
 *                           when there is no device).
 * @return ::FP8QUANT_SUCCESS for compute capability 9.0 (Hopper: sm_90a code) or any 10.x
 *         (datacenter Blackwell such as B200 and B300: sm_100f code),
 *         ::FP8QUANT_ERROR_UNSUPPORTED_DEVICE for any other (12.x Blackwell included),
 *         ::FP8QUANT_ERROR_NO_DEVICE without a device or driver, ::FP8QUANT_ERROR_CUDA if the
 *         query fails.
 */
FP8QUANT_API fp8quant_status_t fp8quant_check_device(int* major, int* minor);

/**
 * @brief Turn programmatic dependent launch (PDL) on or off for every later launch, in every
 *        thread of the process.
 *
 * With PDL on (the default), a kernel may start while the previous kernel in its stream is
 * finishing; it waits for that kernel's writes (`griddepcontrol.wait`) before it touches global
 * memory. Turning it off launches every kernel plainly, one after the other: a switch for
 * bisecting a corruption to fp8quant's launches. The results are the same either way. Setting
 * the environment variable `FP8QUANT_PDL=0` before the library loads starts with PDL off.
 *
 * @param enabled  Nonzero to turn PDL on, zero to turn it off.
 * @return The previous setting (1 on, 0 off).
 */
FP8QUANT_API int fp8quant_set_pdl(int enabled);

/** @brief 1 if kernels launch with programmatic dependent launch, 0 if not (fp8quant_set_pdl()). */
FP8QUANT_API int fp8quant_pdl_enabled(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FP8QUANT_COMMON_H_
