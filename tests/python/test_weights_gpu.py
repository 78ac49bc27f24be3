"""GPU tests of fp8quant.per_block_quant: the kernel bit-identical to the reference, through the
shared harness (poisoned out= buffers with guards, allocated outputs over a dirtied allocator,
whole buffers compared), over edge shapes (partial blocks at both edges, N and K of 1, 3, 4097),
every dtype, UE8M0, experts (3-D), strided and unaligned weights, special values, streams, CUDA
graphs with PDL on and off, and torch.compile. Marked ``gpu``."""

from __future__ import annotations

import math

import pytest
import torch
from gpu_harness import check_graph, check_op, check_side_stream, pdl_setting

import fp8quant
from fp8quant import reference
from fp8quant.weights import _block_quant as OP

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_weight(shape, dtype, gen, *, special=True) -> torch.Tensor:
    """Random weights, each 128 x 128 block of its own magnitude (10^-3 .. 10^3); with
    ``special``, zeros, NaN, ±inf, subnormals and the dtype's max sprinkled in."""
    w = torch.randn(shape, generator=gen, device="cuda")
    n, k = shape[-2], shape[-1]
    mags = 10.0 ** (torch.rand((*shape[:-2], -(-n // 128), 1, -(-k // 128), 1), generator=gen, device="cuda") * 6 - 3)
    mags = mags.expand(*shape[:-2], -(-n // 128), 128, -(-k // 128), 128).flatten(-2).flatten(-3, -2)
    w = (w * mags[..., :n, :k]).to(dtype)
    if special and w.numel() > 64:
        flat = w.view(-1)
        idx = torch.randint(w.numel(), (8,), generator=gen, device="cuda")
        info = torch.finfo(dtype)
        values = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, info.tiny / 2, -info.max, 3.0], device="cuda")
        flat[idx] = values.to(dtype)
    return w


def check(w, *, ue8m0=False, eps=1e-4, out_kwargs=None):
    refs = reference.per_block_quant(w, ue8m0=ue8m0, eps=eps)
    return check_op(
        lambda out=None: fp8quant.per_block_quant(w, ue8m0=ue8m0, eps=eps, out=out), refs,
        OP.buffers(w, 128, 128, ue8m0, eps), x=w, out_kwargs=out_kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("k", [1, 3, 128, 200, 4097, 7168])
@pytest.mark.parametrize("n", [1, 3, 128, 129, 4097])
def test_bf16_shapes(n, k, gen):
    check(make_weight((n, k), torch.bfloat16, gen))


@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32", "ue8m0"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("n,k", [(300, 520), (1, 7168), (7168, 130), (256, 384)])
def test_dtypes_and_ue8m0(n, k, dtype, ue8m0, gen):
    check(make_weight((n, k), dtype, gen), ue8m0=ue8m0)


@pytest.mark.parametrize("eps", [1e-4, 1e-10, torch.finfo(torch.float32).tiny])
def test_eps_and_tiny_blocks(eps, gen):
    """Blocks of all zeros and of tiny values: eps decides, and scales below 2^-90 take the
    kernel's IEEE division."""
    w = make_weight((384, 384), torch.float32, gen, special=False)
    w[:128, :128] = 0
    w[128:256, :128] *= 1e-33
    check(w, eps=eps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_experts_3d(dtype, gen):
    w = make_weight((3, 260, 200), dtype, gen)
    check(w)
    check(make_weight((5, 4097, 128), dtype, gen)[:, 1:, :])  # strided experts, N not a multiple of 128


@pytest.mark.parametrize(
    "case", ["w_misaligned_ptr", "w_odd_row_stride", "k_not_multiple_of_16_bytes", "q_odd_row_stride", "q_misaligned"]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_unaligned(case, dtype, gen):
    n, k = 200, 384
    dense = make_weight((n, k), dtype, gen)
    out_kwargs = None
    if case == "w_misaligned_ptr":
        w = torch.zeros((n, k + 8), dtype=dtype, device="cuda")[:, 1 : 1 + k]
    elif case == "w_odd_row_stride":
        w = torch.zeros((n, k + 1), dtype=dtype, device="cuda")[:, :k]
    elif case == "k_not_multiple_of_16_bytes":
        dense = make_weight((n, 389), dtype, gen)
        w = dense
    else:
        w = dense
        out_kwargs = {"row_pad": 3} if case == "q_odd_row_stride" else {"offset": 1}
    if w is not dense:
        w.copy_(dense)
    check(w, out_kwargs=out_kwargs)


def test_side_stream(gen):
    w = make_weight((1000, 1000), torch.bfloat16, gen)
    refs = reference.per_block_quant(w)
    check_side_stream(
        lambda out=None: fp8quant.per_block_quant(w, out=out), refs, OP.buffers(w, 128, 128, False, 1e-4), x=w
    )


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl_on", "pdl_off"])
@pytest.mark.parametrize("variant", ["out", "allocating"])
def test_cuda_graph(variant, pdl, gen):
    w = make_weight((300, 400), torch.bfloat16, gen)
    with pdl_setting(pdl):
        check_graph(
            lambda out=None: fp8quant.per_block_quant(w, ue8m0=True, out=out),
            lambda: w.copy_(make_weight((300, 400), torch.bfloat16, gen)),
            lambda: reference.per_block_quant(w, ue8m0=True),
            OP.buffers(w, 128, 128, True, 1e-4),
            variant=variant,
        )


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_torch_compile(dynamic, gen):
    torch._dynamo.reset()
    fn = torch.compile(lambda w: fp8quant.per_block_quant(w * 2), fullgraph=True, dynamic=dynamic)
    for n in (130, 300):
        w = make_weight((n, 260), torch.bfloat16, gen)
        q, s = fn(w)
        rq, rs = reference.per_block_quant(w * 2)
        assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    torch._dynamo.reset()


def test_c_api_errors_reach_python():
    w = torch.ones((256, 256), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"^block_n: must be 128, got 64$"):
        fp8quant.per_block_quant(w, (64, 128))
    q = w.view(torch.float8_e4m3fn)[:, :256]  # the bytes of w itself
    with pytest.raises(ValueError, match=r"^q: overlaps w$"):
        fp8quant.per_block_quant(w, out=(q, torch.empty(2, 2, device="cuda")))
