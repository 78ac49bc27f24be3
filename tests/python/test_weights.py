"""fp8quant.per_block_quant on the CPU: the reference against values computed independently
(handmath, block by block), partial edge blocks, UE8M0 re-quantization, argument checks (the
kernel's 128 x 128 blocks on the CPU too), and the op's registration (fake geometry,
torch.compile)."""

from __future__ import annotations

import math

import pytest
import torch
from handmath import expected_group

import fp8quant
from fp8quant import reference

FP8 = torch.float8_e4m3fn


def randn(*shape, dtype=torch.bfloat16, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** (torch.rand(shape[:-1] + (1,), generator=g) * 6 - 3)  # rows of varied magnitude
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def expected_blocks(w: torch.Tensor, bn: int, bk: int, *, ue8m0: bool, eps: float):
    """Scales and q bytes of a 2-D w by SPEC 3, each block through handmath's group arithmetic."""
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    scales = torch.empty(nb, kb, dtype=torch.float32)
    q = torch.empty(n, k, dtype=torch.uint8)
    values = w.float()
    for i in range(nb):
        for j in range(kb):
            block = values[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk]
            s, _, qb = expected_group(block.flatten().tolist(), ue8m0=ue8m0, eps=eps)
            scales[i, j] = s
            q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = torch.tensor(qb, dtype=torch.uint8).view(block.shape)
    return q, scales


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("n, k, bn, bk", [(8, 16, 4, 8), (9, 13, 4, 8), (3, 5, 4, 8), (16, 24, 16, 8)])
def test_reference_against_hand_arithmetic(n, k, bn, bk, ue8m0):
    """Random blocks (with partial ones at the edges), special values sprinkled in."""
    w = randn(n, k, dtype=torch.float32, seed=n * k)
    w[0, 0] = math.nan
    w[-1, -1] = -math.inf
    w[n // 2, k // 2] = 0.0
    q, s = reference.per_block_quant(w, (bn, bk), ue8m0=ue8m0, eps=1e-4)
    want_q, want_s = expected_blocks(w, bn, bk, ue8m0=ue8m0, eps=1e-4)
    assert s.shape == want_s.shape and s.is_contiguous()
    assert torch.equal(s.view(torch.int32), want_s.view(torch.int32))
    assert torch.equal(q.view(torch.uint8), want_q)


def test_worked_values():
    """SPEC 3: amax 448 gives scale 1, 672 gives 1.5 (UE8M0: 2, and the block is re-quantized
    with 2); a zero block gets eps / 448 (eps default 1e-4)."""
    w = torch.zeros(256, 256, dtype=torch.bfloat16)
    w[0, 0] = 448.0
    w[0, 200] = -672.0
    w[130, 1] = 3.0
    q, s = fp8quant.per_block_quant(w)
    zero = (torch.tensor(1e-4, dtype=torch.float32).double() / 448).float().item()
    three = (torch.tensor(3.0, dtype=torch.float64) / 448).float().item()
    assert s.tolist() == [[1.0, 1.5], [three, zero]]
    qb = q.view(torch.uint8)
    assert qb[0, 0] == 0x7E and qb[0, 200] == 0xFE and qb[130, 1] == 0x7E
    q2, s2 = fp8quant.per_block_quant(w, ue8m0=True)
    assert s2[0].tolist() == [1.0, 2.0]
    assert q2.view(torch.uint8)[0, 200] == 0xFA  # -672 / 2 = -336, a tie: rounds to even, -320
    assert q2.float()[0, 200].item() == -320.0


def test_3d_is_per_expert():
    w = randn(3, 130, 260, seed=3)
    q, s = fp8quant.per_block_quant(w)
    assert q.shape == w.shape and s.shape == (3, 2, 3) and s.is_contiguous()
    for e in range(3):
        rq, rs = reference.per_block_quant(w[e])
        assert torch.equal(q[e].view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s[e], rs)


def test_dequantized_weight_is_close():
    w = randn(256, 384, seed=5)
    q, s = fp8quant.per_block_quant(w)
    deq = (q.float().unflatten(1, (3, 128)).unflatten(0, (2, 128)) * s[:, None, :, None]).flatten(2).flatten(0, 1)
    rel = ((deq - w.float()).norm() / w.float().norm()).item()
    assert rel < 0.05


def test_out_and_strided_q():
    w = randn(130, 256, seed=7)
    big = torch.zeros(130, 384, dtype=FP8)
    q = big[:, :256]
    s = torch.empty(2, 2)
    assert fp8quant.per_block_quant(w, out=(q, s)) == (q, s)
    rq, rs = reference.per_block_quant(w)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    assert not big.view(torch.uint8)[:, 256:].any()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"w": torch.ones(4, 8, dtype=torch.int32)}, TypeError, r"^w must be bfloat16, float16 or float32"),
        ({"w": torch.ones(8)}, ValueError, r"^w must be 2-D \[N, K\] or 3-D \[E, N, K\]"),
        ({"w": torch.ones(4, 0)}, ValueError, r"^w.shape\[-1\] \(K\) must be positive"),
        ({"w": torch.ones(8, 4).t()}, ValueError, r"^w must have a contiguous last dimension"),
        ({"block_size": (128,)}, ValueError, r"^block_size must be a pair of positive ints"),
        ({"block_size": (0, 128)}, ValueError, r"^block_size must be a pair of positive ints"),
        ({"block_size": (128.0, 128)}, ValueError, r"^block_size must be a pair of positive ints"),
        ({"block_size": (64, 128)}, ValueError, r"^block_n: must be 128, got 64$"),
        ({"block_size": [128, 256]}, ValueError, r"^block_k: must be 128, got 256$"),
        ({"ue8m0": None}, TypeError, r"^ue8m0 must be a bool"),
        ({"eps": 0.0}, ValueError, r"^eps must be a positive float32 number"),
        ({"eps": 1e-45}, ValueError, r"^eps must be a positive float32 number"),
        (
            {"out": (torch.empty(4, 256, dtype=FP8), torch.empty(1, 3))},
            ValueError,
            r"^out\[1\] \(scale\) must have shape \(1, 2\)",
        ),
        (
            {"out": (torch.empty(4, 256, dtype=torch.uint8), torch.empty(1, 2))},
            TypeError,
            r"^out\[0\] \(q\) must be torch\.float8_e4m3fn",
        ),
        (
            {"w": torch.ones(256, 256), "out": (torch.empty(256, 256, dtype=FP8), torch.empty(2, 2).t())},
            ValueError,
            r"^out\[1\] \(scale\) must have strides \(2, 1\) \(contiguous block scales\), got \(1, 2\)",
        ),
    ],
)
def test_argument_errors(kwargs, error, message):
    args = {"w": torch.ones(4, 256, dtype=torch.bfloat16), **kwargs}
    w = args.pop("w")
    with pytest.raises(error, match=message):
        fp8quant.per_block_quant(w, **args)


def test_kernel_blocks_on_the_cpu_too():
    """The kernels take 128 x 128 blocks: per_block_quant and requantize_ue8m0 refuse others on the
    CPU too, with the C API's message, before either path; the references take any."""
    w = randn(256, 256, seed=11)
    q, s = reference.per_block_quant(w, (64, 128))
    assert s.shape == (4, 2)
    for call in (lambda: fp8quant.per_block_quant(w, (64, 128)), lambda: fp8quant.requantize_ue8m0(q, s, (64, 128))):
        with pytest.raises(ValueError, match=r"^block_n: must be 128, got 64$"):
            call()
    with pytest.raises(ValueError, match=r"^block_k: must be 128, got 32$"):
        fp8quant.requantize_ue8m0(*reference.per_block_quant(w, (128, 32)), (128, 32))
    assert reference.requantize_ue8m0(q, s, (64, 128))[1].shape == (4, 2)


def test_empty():
    q, s = fp8quant.per_block_quant(torch.empty(0, 256, dtype=torch.bfloat16))
    assert q.shape == (0, 256) and s.shape == (0, 2)


def test_fake_and_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    with FakeTensorMode():
        q, s = torch.ops.fp8quant.per_block_quant(torch.empty(300, 200, dtype=torch.bfloat16), 128, 128, False, 1e-4)
        assert q.shape == (300, 200) and s.shape == (3, 2) and s.stride() == (2, 1)
    torch._dynamo.reset()
    w = randn(300, 200, seed=9)
    fn = torch.compile(
        lambda w: fp8quant.per_block_quant(w * 1, ue8m0=True), fullgraph=True, backend="aot_eager", dynamic=True
    )
    q, s = fn(w)
    rq, rs = reference.per_block_quant(w, ue8m0=True)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    torch.library.opcheck(
        torch.ops.fp8quant.per_block_quant.default, (w, 128, 128, False, 1e-4),
        test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"),
    )  # fmt: skip
