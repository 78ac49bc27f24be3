#!/usr/bin/env bash
# Set up .venv with fp8quant, then run the C++ tests (ctest) and the Python tests (pytest)
# against the installed package. GPU tests run where a compute capability 9.0 or 10.x GPU is present and are
# skipped elsewhere.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

echo "==> C++ tests"
cmake -S . -B build/test -G Ninja -DFP8QUANT_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/test
ctest --test-dir build/test --output-on-failure

echo "==> Python tests"
# The installed package is imported (python/ is not on sys.path from the repository root).
python -m pytest tests/python "$@"
