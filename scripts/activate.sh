#!/usr/bin/env bash
# Source this from the repository root: activate the environment scripts/setup.sh makes
# (FP8QUANT_VENV, default .venv), running setup.sh first when there is none.
venv=${FP8QUANT_VENV:-.venv}
if [ -x "$venv/bin/python" ]; then
  . "$venv/bin/activate"
else
  . scripts/setup.sh
fi
