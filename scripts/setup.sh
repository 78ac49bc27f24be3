#!/usr/bin/env bash
# Create (or reuse) the virtual environment .venv and install fp8quant into it, built from this
# checkout. Sourced by run.sh and test.sh; needs python3 >= 3.10 and a CUDA toolkit >= 12.9
# (nvcc on PATH or CUDACXX set). Override the interpreter with PYTHON, the torch requirement
# with TORCH_SPEC.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=${FP8QUANT_VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"

echo "==> installing build and test requirements"
python -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}" \
  numpy "pytest>=8" "hypothesis>=6" "cmake>=3.31" "ninja>=1.11" "nanobind>=2.4" "scikit-build-core>=0.10" \
  "transformers>=5.17,<5.18" "torchao>=0.18,<0.19"

echo "==> building and installing fp8quant"
python -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .
