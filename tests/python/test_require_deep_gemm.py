"""FP8QUANT_REQUIRE_DEEP_GEMM=1 (set by scripts/gpu_check.sh when it installs DeepGEMM): the pytest
session stops unless ``import deep_gemm`` succeeds, so that the DeepGEMM tests cannot skip
unnoticed. Checked with stand-in ``deep_gemm`` packages, one that imports and one that fails.
FP8QUANT_REQUIRE (gpu_check.sh: triton, transformers) the same way for any module it names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def collect(tmp_path: Path, body: str | None, **env_vars: str) -> subprocess.CompletedProcess:
    """Collect this file's sibling test_layouts.py with FP8QUANT_REQUIRE_DEEP_GEMM=1 (or the
    variables given) and a ``deep_gemm`` package whose __init__ is ``body`` first on the path
    (None: no such package)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FP8QUANT_REQUIRE", "FP8QUANT_REQUIRE_DEEP_GEMM")}
    env.update(env_vars or {"FP8QUANT_REQUIRE_DEEP_GEMM": "1"})
    if body is not None:
        (tmp_path / "deep_gemm").mkdir()
        (tmp_path / "deep_gemm" / "__init__.py").write_text(body)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "test_layouts.py"), "--collect-only", "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, env=env, cwd=HERE.parent.parent, timeout=300,
    )  # fmt: skip


def test_stops_when_deep_gemm_fails_to_import(tmp_path):
    run = collect(tmp_path, "raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "deep_gemm is required (FP8QUANT_REQUIRE) but import deep_gemm failed" in run.stdout + run.stderr
    assert "libcuda.so.1" in run.stdout + run.stderr


def test_runs_when_deep_gemm_imports(tmp_path):
    run = collect(tmp_path, "__version__ = '2.6.1'\n")
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr


def test_require_names_any_module(tmp_path):
    run = collect(tmp_path, None, FP8QUANT_REQUIRE="json, fp8quant_no_such_module")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "fp8quant_no_such_module is required (FP8QUANT_REQUIRE) but import" in run.stdout + run.stderr
    run = collect(tmp_path, "__version__ = '2.6.1'\n", FP8QUANT_REQUIRE="json,deep_gemm")
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
