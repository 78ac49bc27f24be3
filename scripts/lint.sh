#!/usr/bin/env bash
# Lint and format check of the Python sources (ruff, configured in pyproject.toml), in the
# environment scripts/setup.sh made (.venv, or FP8QUANT_VENV). `scripts/lint.sh --fix` applies
# the fixes and the formatting instead of checking.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=${FP8QUANT_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "ruff==0.17.6"
paths=(python tests benchmarks)
if [ "${1:-}" = "--fix" ]; then
  "$venv/bin/ruff" check --fix "${paths[@]}"
  "$venv/bin/ruff" format "${paths[@]}"
else
  "$venv/bin/ruff" check "${paths[@]}"
  "$venv/bin/ruff" format --check "${paths[@]}"
  echo "==> lint: ruff check and ruff format --check passed"
fi
