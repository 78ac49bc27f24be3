"""Where the installed package keeps its C++ side (cmake_dir, include_dir, library_path), the
command line that prints it, and the CUDA version the library reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fp8quant
from fp8quant.__main__ import main

PACKAGE = Path(fp8quant.__file__).resolve().parent
INSTALLED = (PACKAGE / "lib" / "cmake" / "fp8quant").is_dir()  # False in a source checkout
HAS_EXTENSION = fp8quant._ext._C is not None


@pytest.mark.skipif(not INSTALLED, reason="fp8quant runs from a source checkout: no C++ package inside")
def test_installed_cpp_package():
    cmake = fp8quant.cmake_dir()
    assert (cmake / "fp8quantConfig.cmake").is_file()
    assert (cmake / "fp8quantTargets.cmake").is_file()
    version_file = (cmake / "fp8quantConfigVersion.cmake").read_text()
    assert f'set(PACKAGE_VERSION "{fp8quant.__version__}")' in version_file
    assert (fp8quant.include_dir() / "fp8quant" / "fp8quant.h").is_file()
    assert fp8quant.library_path().name == "libfp8quant.so" and fp8quant.library_path().is_file()
    assert not fp8quant.library_path().is_symlink()


@pytest.mark.skipif(INSTALLED, reason="fp8quant is installed: its C++ package is there")
def test_source_checkout_says_where_the_package_is_missing():
    with pytest.raises(FileNotFoundError, match=r"^the CMake package was not found at .*lib/cmake/fp8quant: "):
        fp8quant.cmake_dir()


@pytest.mark.skipif(not INSTALLED, reason="fp8quant runs from a source checkout: no C++ package inside")
@pytest.mark.parametrize("flag", ["--cmake-dir", "--include-dir", "--library-path"])
def test_command_line_prints_the_locations(flag, capsys):
    assert main([flag]) == 0
    printed = Path(capsys.readouterr().out.strip())
    where = {
        "--cmake-dir": fp8quant.cmake_dir,
        "--include-dir": fp8quant.include_dir,
        "--library-path": fp8quant.library_path,
    }[flag]()
    assert printed == where and printed.is_relative_to(PACKAGE)


def test_location_flags_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        main(["--cmake-dir", "--include-dir"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_EXTENSION, reason="the CUDA extension is not built")
def test_cuda_version_and_version_flag(capsys):
    major, minor = fp8quant.cuda_version()
    assert (major, minor) >= (12, 8) and 0 <= minor < 100
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"fp8quant {fp8quant.__version__} (CUDA {major}.{minor})\n"


def test_version_matches_the_c_header():
    header = (Path(__file__).resolve().parents[2] / "include" / "fp8quant" / "common.h").read_text()
    parts = [re.search(rf"#define FP8QUANT_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == fp8quant.__version__


def _code(text: str) -> list[str]:
    """Lines of CMake code without comments and blank lines."""
    lines = (line.split("#", 1)[0].rstrip() for line in text.splitlines())
    return [line for line in lines if line]


def test_readme_cmake_example_is_the_consumer():
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    example = re.search(r"```cmake\n(.*?)```", readme, re.S).group(1)
    assert _code(example) == _code((root / "tests" / "consumer" / "CMakeLists.txt").read_text())
