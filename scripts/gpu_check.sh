#!/usr/bin/env bash
# Validate fp8quant on a machine with a compute capability 9.0 or 10.x GPU, with fp8quant
# already installed in the current Python: the C++ tests, the whole pytest suite,
# compute-sanitizer (memcheck, racecheck) on representative launches, and the benchmarks (device
# time of the quantizer, weights, GEMM and MoE modes; eager host time). Logs go to $LOGDIR
# (default build/gpu-check). Stages can be picked:
# scripts/gpu_check.sh ctest pytest sanitize bench
#
# DeepGEMM, the consumer of fp8quant's DeepGEMM formats, is installed first when a wheel of it is
# at $DEEP_GEMM_WHEEL (default: the newest ../shared/wheels/deep_gemm-*.whl); its tests then must
# run (FP8QUANT_REQUIRE_DEEP_GEMM=1 makes pytest stop if deep_gemm does not import) instead of
# skipping. DEEP_GEMM_WHEEL=none runs without it. Triton and transformers (the PDL producer, the
# stream gate, the Triton GEMM backend, the transformers integration) must import too
# (FP8QUANT_REQUIRE; set it to "" to allow their tests to skip).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
logdir=${LOGDIR:-build/gpu-check}
mkdir -p "$logdir"
stages=("${@:-ctest pytest sanitize bench}")
export FP8QUANT_REQUIRE=${FP8QUANT_REQUIRE-triton,transformers}
status=0

wheel=${DEEP_GEMM_WHEEL:-$(ls -t ../shared/wheels/deep_gemm-*.whl 2>/dev/null | head -1)}
if [ -n "$wheel" ] && [ "$wheel" != none ]; then
  echo "==> DeepGEMM: installing $wheel"
  python -m pip install --no-deps --no-index --force-reinstall "$wheel" || exit 1
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}             # its JIT runs nvcc on first use
  export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-$PWD/build/deep_gemm-cache}
  export FP8QUANT_REQUIRE_DEEP_GEMM=1
else
  echo "==> DeepGEMM: no wheel (DEEP_GEMM_WHEEL or ../shared/wheels): its tests will skip"
fi

run() {  # run NAME CMD...: tee the output to $logdir/NAME.log, remember a failure
  local name=$1
  shift
  echo "==> $name: $*"
  "$@" 2>&1 | tee "$logdir/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "==> $name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
}

for stage in ${stages[*]}; do
  case $stage in
    ctest)
      run ctest bash -c "cmake -S . -B build/gpu-ctest -G Ninja -DFP8QUANT_BUILD_TESTS=ON >/dev/null &&
        cmake --build build/gpu-ctest && ctest --test-dir build/gpu-ctest --output-on-failure -V" ;;
    pytest)
      run pytest python -m pytest tests/python -q -ra --durations=15 ;;
    sanitize)
      # memcheck over the Python cases (every format, dtype, group size, edge shapes); racecheck,
      # which does not run PyTorch programs to the end, over the C API test's launch (needs ctest)
      run sanitize-memcheck env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        compute-sanitizer --tool memcheck --error-exitcode 1 python tests/tools/sanitize_cases.py
      for api in c_api weights_api pack_api moe_api norm_api mx_api; do
        run "sanitize-racecheck-$api" compute-sanitizer --tool racecheck --error-exitcode 1 \
          "build/gpu-ctest/tests/cpp/test_$api"
      done ;;
    bench)
      run bench python -m fp8quant bench --json "$logdir/bench.json" --markdown "$logdir/bench.md"
      run bench-host python -m fp8quant bench --host-overhead --markdown "$logdir/bench_host.md"
      for mode in weights gemm moe; do
        run "bench-$mode" python -m fp8quant bench "--$mode" --markdown "$logdir/bench_$mode.md"
      done ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
exit $status
