"""Shared pytest setup: tests marked ``@pytest.mark.gpu`` (marker declared in pyproject.toml)
are skipped unless a CUDA device of compute capability 9.0 or 10.x (the chips the sm_90a and
sm_100f builds run on) is present; ``gen``, a CUDA generator seeded from the test's id.
``FP8QUANT_REQUIRE=triton,transformers,...`` (scripts/gpu_check.sh sets it) stops the session at
once unless each named module imports, so that the tests that need it run rather than skip;
``FP8QUANT_REQUIRE_DEEP_GEMM=1`` adds ``deep_gemm`` (set when gpu_check.sh installs DeepGEMM)."""

from __future__ import annotations

import functools
import importlib
import os
import zlib

import pytest
import torch


def supported(major: int, minor: int) -> bool:
    return (major, minor) == (9, 0) or major == 10


@functools.cache
def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if not supported(major, minor):
        return f"needs compute capability 9.0 or 10.x, this device is {major}.{minor}"
    return None


def required_modules() -> list[str]:
    """The modules FP8QUANT_REQUIRE (comma-separated) and FP8QUANT_REQUIRE_DEEP_GEMM=1 name."""
    names = [n.strip() for n in os.environ.get("FP8QUANT_REQUIRE", "").split(",") if n.strip()]
    if os.environ.get("FP8QUANT_REQUIRE_DEEP_GEMM") == "1":
        names.append("deep_gemm")
    return list(dict.fromkeys(names))


def pytest_configure(config: pytest.Config) -> None:
    for name in required_modules():
        try:
            importlib.import_module(name)
        except Exception as e:  # any failure of the import: the run would skip what it must test
            raise pytest.UsageError(f"{name} is required (FP8QUANT_REQUIRE) but import {name} failed: {e!r}") from e


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CUDA generator seeded from the test id: reproducible, different per test."""
    return torch.Generator(device="cuda").manual_seed(zlib.crc32(request.node.nodeid.encode()))
