#!/usr/bin/env bash
# Set up .venv with fp8quant and run the main job: the benchmark (on a CUDA GPU) or, without
# one, the PyTorch reference on the CPU. Extra arguments go to `python -m fp8quant bench`.
set -euo pipefail
# Show the build (CMake's configure, then a line per compiled file) instead of minutes of
# silence: setup.sh runs pip with -q, and PIP_VERBOSE=2 nets pip's -v, which streams the build
# backend's output. A PIP_VERBOSE of the caller's wins.
export PIP_VERBOSE=${PIP_VERBOSE:-2}
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
python -m fp8quant bench "$@"
