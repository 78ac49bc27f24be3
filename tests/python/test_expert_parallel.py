"""fp8quant.expert_parallel on CPU tensors over gloo, in worlds of 2 and 4 processes: the layer and
the landed rows bit-identical to the single-process ops of the same global MoE (both modes, both
layouts, FP8 and bf16 on the wire; uneven T per rank, a rank without tokens, a rank that receives
none, dropped slots, a token whose experts are all on one rank), the bytes on the wire, what the
module reads back to the host, process subgroups and argument validation (scenarios in
ep_harness.py; each world starts once and runs them all). The same checks on GPUs over NCCL:
test_expert_parallel_gpu.py."""

from __future__ import annotations

import pytest
import torch
from ep_harness import SCENARIOS, WORLD4_SCENARIOS, run_world

import fp8quant
from fp8quant.expert_parallel import EpHandle, WireFormat, ep_combine, ep_dispatch


@pytest.fixture(scope="module")
def failures(tmp_path_factory) -> dict[int, dict[str, str]]:
    """Every scenario's failures, per world size (each world runs once for the module)."""
    return {
        world: run_world(world, "cpu", [*SCENARIOS, *(WORLD4_SCENARIOS if world == 4 else ())],
                         tmp_path_factory.mktemp(f"world{world}"))
        for world in (2, 4)
    }  # fmt: skip


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario(failures, world, scenario):
    assert scenario not in failures[world], failures[world][scenario]


@pytest.mark.parametrize("scenario", list(WORLD4_SCENARIOS))
def test_world4_scenario(failures, scenario):
    assert scenario not in failures[4], failures[4][scenario]


def test_wire_rows():
    """A token's row to one rank: FP8 data, fp32 scales and int32 ids, padded to 16 bytes; the bf16
    row is twice the data. DeepSeek-V3 (H = 7168, k = 8): 7424 bytes against 14368 (0.517)."""
    fp8, bf16 = WireFormat("fp8", 7168, 8), WireFormat("bf16", 7168, 8)
    assert (fp8.data_bytes, fp8.scale_bytes, fp8.ids_offset, fp8.row_bytes) == (7168, 224, 7392, 7424)
    assert (bf16.data_bytes, bf16.scale_bytes, bf16.ids_offset, bf16.row_bytes) == (14336, 0, 14336, 14368)
    assert WireFormat("fp8", 256, 3).row_bytes == 288  # 256 + 8 + 12 = 276, padded


def test_wire_pack_and_fields():
    """pack() holds each token's quantized row, scales and ids, then an empty row (zeros, ids -1)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=gen).to(torch.bfloat16)
    ids = torch.tensor([[0, 5], [-1, 2], [7, 1]], dtype=torch.int32)
    fmt = WireFormat("fp8", 256, 2)
    rows = fmt.pack(x, ids)
    data, scale, got_ids = fmt.fields(rows)
    q, s = fp8quant.per_token_group_quant(x, 128, scale_layout="row")
    assert torch.equal(data[:3], q.view(torch.uint8)) and torch.equal(scale[:3], s)
    assert torch.equal(got_ids[:3], ids) and (got_ids[3] == -1).all()
    assert not data[3].any() and not scale[3].any()


def test_group_not_initialized():
    assert not torch.distributed.is_initialized()
    x, ids = torch.zeros(2, 128, dtype=torch.bfloat16), torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="group: torch.distributed is not initialized"):
        ep_dispatch(x, ids, 8)


def _one_rank_handle() -> EpHandle:
    """A one-rank combine by hand: 4 layout rows sent back in order, tokens t0 (rows 0, 1) and t1
    (rows 2, 3)."""
    return EpHandle(group=None, layout_shape=(4,), combine_rows=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                    return_rows=torch.arange(4), return_splits=None, combine_splits=None, combine_recv_rows=4,
                    dispatch_bytes=0, combine_peer_rows=0)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"y": torch.ones(4, 128, dtype=torch.int32)}, TypeError, r"^y must be bfloat16, float16 or float32, got torch.int32$"),
        ({"y": torch.ones(4, 128, dtype=torch.bfloat16, device="meta")}, ValueError,
         r"^y is on meta, the dispatch's tensors on cpu: all tensors must be on one device$"),
        ({"topk_weights": torch.ones(2, 2, dtype=torch.int64)}, TypeError,
         r"^topk_weights must be a floating-point tensor \(taken as float32\), got torch.int64$"),
        ({"topk_weights": torch.ones(2, 2, device="meta")}, ValueError,
         r"^topk_weights is on meta, y on cpu: all tensors must be on one device$"),
        ({"topk_weights": torch.ones(2, 3)}, ValueError, r"^topk_weights must be a tensor \[T, k\] = \(2, 2\)"),
    ],
)  # fmt: skip
def test_combine_checks_before_communicating(monkeypatch, change, error, match):
    """ep_combine checks its arguments before the all-to-all (module docstring): a rank that raised
    after it would leave its peers waiting. y's dtype and topk_weights' dtype and device were
    checked only by moe_combine, after the exchange."""
    calls = []
    monkeypatch.setattr(
        torch.distributed, "all_to_all_single", lambda out, inp, *a, **k: calls.append(1) or out.copy_(inp)
    )
    args = {"y": torch.randn(4, 128).to(torch.bfloat16), "topk_weights": torch.rand(2, 2)}
    out = ep_combine(args["y"], _one_rank_handle(), args["topk_weights"])  # the spy stands for one rank's exchange
    assert calls == [1]
    assert torch.equal(out, fp8quant.moe_combine(args["y"], _one_rank_handle().combine_rows, args["topk_weights"]))
    args.update(change)
    with pytest.raises(error, match=match):
        ep_combine(args["y"], _one_rank_handle(), args["topk_weights"])
    assert calls == [1]  # nothing more sent
