"""The release workflow and pyproject.toml agree (CPU): the workflow takes every build option
from [tool.cibuildwheel] and adds only the CUDA 12 build's image and version label, the ones
pyproject.toml documents; the builds cover Python 3.10, 3.11 and 3.12 (abi3)."""

from __future__ import annotations

import pathlib
import re

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


@pytest.fixture(scope="module")
def texts():
    if not WORKFLOW.is_file():
        pytest.skip("no .github/workflows/release.yml here (the sdist leaves CI files out)")
    return WORKFLOW.read_text(), (ROOT / "pyproject.toml").read_text()


def test_workflow_sets_only_the_cuda12_options(texts):
    workflow, pyproject = texts
    settings = dict(re.findall(r"^\s+(CIBW_\w+|FP8QUANT_\w+): (\S+)$", workflow, flags=re.M))
    assert settings == {
        "CIBW_MANYLINUX_X86_64_IMAGE": "pytorch/manylinux2_28-builder:cuda12.9",
        "CIBW_ENVIRONMENT_PASS_LINUX": "FP8QUANT_CUDA_TAG",
        "FP8QUANT_CUDA_TAG": "cu12",
    }
    for name, value in settings.items():  # the values pyproject.toml's comment gives
        assert f"{name}={value}" in pyproject


def test_builds_and_image(texts):
    _, pyproject = texts
    config = tomllib.loads(pyproject)["tool"]["cibuildwheel"]
    assert config["build"] == ["cp310-manylinux_x86_64", "cp311-manylinux_x86_64", "cp312-manylinux_x86_64"]
    assert re.fullmatch(r"pytorch/manylinux2_28-builder:cuda13\.\d+", config["manylinux-x86_64-image"])
    assert tomllib.loads(pyproject)["tool"]["scikit-build"]["wheel"]["py-api"] == "cp312"
