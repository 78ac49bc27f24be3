"""fp8quant.expert_parallel on GPUs over NCCL, in worlds of 2 and 4 ranks (rank r on GPU r): every
check test_expert_parallel.py makes on the CPU (the ops now run their kernels; the landed rows
held to the kernels' contract: rows holding a token bit-identical, zero scales on tile padding),
and: the low-latency path under ``torch.cuda.set_sync_debug_mode("error")``, the low-latency
layer captured in a CUDA graph and replayed on other tokens, the layer on each GPU GEMM backend
against the reference backend. Marked ``gpu``; a world needs that many GPUs (skipped otherwise).
Written without a multi-GPU machine: not yet run."""

from __future__ import annotations

import pytest
import torch
from ep_harness import GPU_SCENARIOS, SCENARIOS, WORLD4_SCENARIOS, gpu_backends, run_world

pytestmark = pytest.mark.gpu

WORLDS = (2, 4)
NEEDS_GEMM = ("graph low_latency", "layer gpu backends")  # scenarios that loop over gpu_backends()


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs(world: int):
    return pytest.param(world, marks=pytest.mark.skipif(gpus() < world, reason=f"needs {world} GPUs"))


@pytest.fixture(scope="module")
def failures(tmp_path_factory) -> dict[int, dict[str, str]]:
    """Every scenario's failures, per world size that fits on this machine's GPUs."""
    return {
        world: run_world(world, "cuda", [*SCENARIOS, *GPU_SCENARIOS, *(WORLD4_SCENARIOS if world == 4 else ())],
                         tmp_path_factory.mktemp(f"world{world}"))
        for world in WORLDS
        if world <= gpus()
    }  # fmt: skip


@pytest.mark.parametrize("world", [needs(w) for w in WORLDS])
@pytest.mark.parametrize("scenario", [*SCENARIOS, *GPU_SCENARIOS])
def test_scenario(failures, world, scenario):
    if scenario in NEEDS_GEMM and not gpu_backends():
        pytest.skip("needs a GPU GEMM backend (Triton, or DeepGEMM on SM90)")
    assert scenario not in failures[world], failures[world][scenario]


@pytest.mark.parametrize("world", [needs(4)])
@pytest.mark.parametrize("scenario", list(WORLD4_SCENARIOS))
def test_world4_scenario(failures, world, scenario):
    assert scenario not in failures[world], failures[world][scenario]
