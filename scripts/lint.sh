#!/usr/bin/env bash
# Lint and format check: the Python sources with ruff (configured in pyproject.toml), the C, C++
# and CUDA sources with clang-format (.clang-format), in the environment scripts/setup.sh made
# (.venv, or FP8QUANT_VENV). `scripts/lint.sh --fix` applies the fixes and the formatting
# instead of checking.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=${FP8QUANT_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "ruff==0.17.6" "clang-format==19.1.7"
paths=(python tests benchmarks)
mapfile -t sources < <(git ls-files 'src/**' 'include/**' 'tests/cpp/**' 'tests/emulation/**' 'benchmarks/*.cu' | grep -E '\.(h|hpp|cpp|cu|cuh)$')
if [ "${1:-}" = "--fix" ]; then
  "$venv/bin/ruff" check --fix "${paths[@]}"
  "$venv/bin/ruff" format "${paths[@]}"
  "$venv/bin/clang-format" -i "${sources[@]}"
else
  "$venv/bin/ruff" check "${paths[@]}"
  "$venv/bin/ruff" format --check "${paths[@]}"
  "$venv/bin/clang-format" --dry-run --Werror "${sources[@]}"
  echo "==> lint: ruff check, ruff format --check and clang-format --dry-run passed (${#sources[@]} C/C++/CUDA files)"
fi
