#!/usr/bin/env bash
# Set up .venv with fp8quant and run the main job: the benchmark (on a CUDA GPU) or, without
# one, the PyTorch reference on the CPU. Extra arguments go to `python -m fp8quant bench`.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
python -m fp8quant bench "$@"
