// MXFP8 quantization for datacenter Blackwell: sm_100f code, which runs on every compute
// capability 10.x (B200, B300). The E8M0 byte is computed on the bit pattern there too.
#include "kernels/mx_quant.cuh"

namespace fp8quant::sm100 {

struct Arch {};

fp8quant_status_t mxfp8_quant(const MxProblem& problem, cudaStream_t stream) {
  return kernels::launch_mxfp8_quant<Arch>(problem, stream);
}

}  // namespace fp8quant::sm100
