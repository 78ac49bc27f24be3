"""GPU tests of fp8quant.moe_combine: the kernel bit-identical to the reference run on the GPU,
through the shared harness (poisoned out= buffers with guards), over T in {1, 7, 4096}, k in
{1, 2, 8}, E in {8, 256}, dropped slots, local expert ranges, both layouts, every dtype, an H that
takes the element-wise path, streams, CUDA graphs and torch.compile. Marked ``gpu``."""

from __future__ import annotations

import pytest
import torch

import fp8quant
from fp8quant import reference as R
from fp8quant.moe import _combine as OP
from gpu_harness import check_graph, check_op, check_side_stream, pdl_setting

pytestmark = pytest.mark.gpu


def routed(t: int, k: int, e: int, gen, *, offset: int = 0):
    """topk ids over 2e global experts with some dropped slots, its routing for experts
    offset .. offset + e - 1 (with the masked layout), and fp32 router weights."""
    ids = torch.randint(-1, 2 * e, (t, k), generator=gen, device="cuda", dtype=torch.int32)
    routing = R.moe_routing(ids, e, expert_offset=offset, align=128, max_m=t * k)
    weights = torch.rand((t, k), generator=gen, device="cuda")
    return routing, weights


def check(y, rows, weights, out_kwargs=None):
    ref = R.moe_combine(y, rows, weights)
    check_op(
        lambda out=None: (fp8quant.moe_combine(y, rows, weights, out=None if out is None else out[0]),),
        (ref,), OP.buffers(y, rows, weights), out_kwargs=out_kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("e", [8, 256])
@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("t", [1, 7, 4096])
def test_contiguous(t, k, e, gen):
    routing, weights = routed(t, k, e, gen, offset=e // 2)
    m_sum = routing.m_indices.numel()
    y = torch.randn(m_sum, 7168 if t < 4096 else 1024, generator=gen, device="cuda").to(torch.bfloat16)
    check(y, routing.inv_perm, weights)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_masked_and_dtypes(dtype, gen):
    routing, weights = routed(37, 4, 8, gen)
    y = torch.randn(8, 37 * 4, 512, generator=gen, device="cuda").to(dtype)
    check(y, routing.masked_row, weights)


@pytest.mark.parametrize("h", [1, 3, 100, 1030])
def test_unaligned(h, gen):
    routing, weights = routed(50, 2, 8, gen)
    y = torch.randn(routing.m_indices.numel(), h, generator=gen, device="cuda").to(torch.bfloat16)
    check(y, routing.inv_perm, weights)
    check(y, routing.inv_perm, weights, out_kwargs={"row_pad": 3})


def test_side_stream_graph_compile(gen):
    routing, weights = routed(64, 8, 16, gen)
    y = torch.randn(routing.m_indices.numel(), 2048, generator=gen, device="cuda").to(torch.bfloat16)
    call = lambda out=None: (fp8quant.moe_combine(y, routing.inv_perm, weights, out=None if out is None else out[0]),)  # noqa: E731
    buffers = OP.buffers(y, routing.inv_perm, weights)
    check_side_stream(call, (R.moe_combine(y, routing.inv_perm, weights),), buffers)
    for pdl in (True, False):
        with pdl_setting(pdl):
            check_graph(call, lambda: y.copy_(torch.randn(y.shape, generator=gen, device="cuda")),
                        lambda: (R.moe_combine(y, routing.inv_perm, weights),), buffers, variant="out")  # fmt: skip
    torch._dynamo.reset()
    fn = torch.compile(lambda y, r, w: fp8quant.moe_combine(y * 2, r, w), fullgraph=True, dynamic=True)
    assert torch.equal(fn(y, routing.inv_perm, weights), R.moe_combine(y * 2, routing.inv_perm, weights))
    torch._dynamo.reset()
