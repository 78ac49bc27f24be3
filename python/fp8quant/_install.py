"""Where an installed fp8quant keeps its C++ side: the shared library, the public headers and
the CMake package (``find_package(fp8quant CONFIG)``), all inside the Python package."""

from __future__ import annotations

from pathlib import Path

__all__ = ["cmake_dir", "cuda_version", "include_dir", "library_path"]

_PACKAGE = Path(__file__).resolve().parent


def _existing(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"{what} was not found at {path}: only an fp8quant installed from a wheel or by "
            "`pip install .` carries its C++ package (a source checkout on PYTHONPATH or an editable "
            "install does not)"
        )
    return path


def cmake_dir() -> Path:
    """The folder holding ``fp8quantConfig.cmake``: pass it as ``-Dfp8quant_DIR=...`` (or put it
    on ``CMAKE_PREFIX_PATH``) and ``find_package(fp8quant CONFIG)`` finds ``fp8quant::fp8quant``."""
    return _existing(_PACKAGE / "lib" / "cmake" / "fp8quant", "the CMake package")


def include_dir() -> Path:
    """The folder to add to the include path for ``#include <fp8quant/fp8quant.h>``."""
    return _existing(_PACKAGE / "include", "the C headers")


def library_path() -> Path:
    """The shared library ``libfp8quant.so`` (the C API; needs only the NVIDIA driver)."""
    return _existing(_PACKAGE / "libfp8quant.so", "libfp8quant.so")


def cuda_version() -> tuple[int, int]:
    """(major, minor) of the CUDA toolkit the library was built with: its major version sets the
    oldest NVIDIA driver it runs on (CUDA 13: driver 580 or newer; CUDA 12: 525 or newer, and
    Blackwell GPUs need 570 or newer)."""
    from ._ext import extension  # noqa: PLC0415 - the extension may be missing (source tree)

    version = extension().cuda_version()
    return version // 1000, version % 1000 // 10
