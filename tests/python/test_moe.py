"""The MoE ops on the CPU (their reference path) and their argument checks, the GPU's limits
among them; the kernels are tested against the same references in test_moe_gpu.py."""

from __future__ import annotations

import pytest
import torch

import fp8quant
from fp8quant import reference as R

TOPK = torch.tensor([[1, 3], [1, -1], [0, 1]], dtype=torch.int32)
W = torch.tensor([[0.5, 0.25], [2.0, 7.0], [1.0, -1.0]])


def test_cpu_call_is_the_reference():
    r = R.moe_routing(TOPK, 4, align=4, max_m=3)
    y = torch.randn(12, 40, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = fp8quant.moe_combine(y, r.inv_perm, W)
    assert torch.equal(got, R.moe_combine(y, r.inv_perm, W))
    out = torch.full((3, 48), float("nan"), dtype=torch.bfloat16)[:, :40]
    assert fp8quant.moe_combine(y, r.inv_perm, W, out=out) is out and torch.equal(out, got)
    assert torch.equal(fp8quant.moe_combine(torch.zeros(0, 40), r.inv_perm, W), torch.zeros(3, 40))


def test_out_of_range_rows_contribute_nothing():
    y = torch.ones(4, 8)
    rows = torch.tensor([[0, 4, -1, 3]], dtype=torch.int32)  # 4 is past y's last row
    assert fp8quant.moe_combine(y, rows, torch.ones(1, 4)).tolist() == [[2.0] * 8]


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: fp8quant.moe_combine(torch.ones(4, 8, dtype=torch.int32), TOPK, W), TypeError, r"^y must be a bfloat16"),
        (lambda: fp8quant.moe_combine(torch.ones(8, 4).t(), TOPK, W), ValueError, r"^y must have a contiguous last dimension"),
        (lambda: fp8quant.moe_combine(torch.ones(2, 4, 8)[:, :3], TOPK, W), ValueError, r"evenly spaced rows"),
        (lambda: fp8quant.moe_combine(torch.ones(4, 8), TOPK.long(), W), TypeError, r"^rows must be a contiguous int32"),
        (lambda: fp8quant.moe_combine(torch.ones(4, 8), TOPK, W.double()), TypeError, r"^weights must be a contiguous float32"),
        (lambda: fp8quant.moe_combine(torch.ones(4, 8), TOPK, W[:2]), ValueError, r"^weights must have the shape of rows \(3, 2\)"),
    ],
)  # fmt: skip
def test_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_routing_cpu_call_is_the_reference():
    got = fp8quant.moe_routing(TOPK, 4, align=4, max_m=3)
    ref = R.moe_routing(TOPK, 4, align=4, max_m=3)
    assert all(torch.equal(a, b) for a, b in zip(got[:6], ref[:6]))
    assert got.status is None  # checked as it was made
    got.check()
    with pytest.raises(TypeError, match=r"^topk_ids must be an int32 or int64 tensor \[T, k\]$"):
        fp8quant.moe_routing(TOPK.float(), 4)


def test_silu_mul_quant_cpu_call_is_the_reference():
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    m_indices = torch.tensor([0, -1, 1, 1, -1, 2], dtype=torch.int32)
    for layout in ("row", "mn_tma", "packed_ue8m0"):
        q, s = fp8quant.silu_mul_quant(x, scale_layout=layout, m_indices=m_indices)
        rq, rs = R.silu_mul_quant(x, scale_layout=layout, m_indices=m_indices)
        assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    assert s.stride() == (1, 8)  # packed_ue8m0 of 6 rows: TMA-aligned


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"x": torch.ones(4, 511)}, TypeError, r"even last dimension"),
        ({"x": torch.ones(4, 200)}, ValueError, r"^x.shape\[-1\] / 2 \(N=100\) must be a positive multiple of group_size"),
        ({"m_indices": torch.zeros(4, dtype=torch.int64)}, ValueError, r"^m_indices must be a contiguous int32 tensor of shape \(4,\)$"),
        ({"masked_m": torch.zeros(4, dtype=torch.int32)}, ValueError, r"^masked_m does not apply to x of shape \(4, 512\)$"),
        ({"m_indices": torch.zeros(4, dtype=torch.int32), "masked_m": torch.zeros(1, dtype=torch.int32)}, ValueError, r"not both"),
        ({"scale_layout": "packed_ue8m0", "ue8m0": False}, ValueError, r"contradicts"),
    ],
)  # fmt: skip
def test_silu_mul_quant_errors(kwargs, error, match):
    kwargs = {"x": torch.ones(4, 512), **kwargs}
    with pytest.raises(error, match=match):
        fp8quant.silu_mul_quant(**kwargs)


def test_dispatch_cpu_call_is_the_reference():
    r = R.moe_routing(TOPK, 4, align=4, max_m=3)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for layout, max_m in (("contiguous", None), ("masked", 3)):
        for scale_layout in ("row", "mn", "packed_ue8m0"):
            q, s = fp8quant.moe_dispatch_quant(x, r, layout=layout, max_m=max_m, scale_layout=scale_layout)
            rq, rs = R.moe_dispatch_quant(x, r, layout=layout, max_m=max_m, scale_layout=scale_layout)
            assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    with pytest.raises(ValueError, match=r"^layout='masked' needs max_m, an int >= 1, got None$"):
        fp8quant.moe_dispatch_quant(x, r, layout="masked")
    with pytest.raises(ValueError, match=r"must be a positive multiple of group_size \(128\)"):
        fp8quant.moe_dispatch_quant(x[:, :200], r)
    with pytest.raises(TypeError, match=r"^routing must be"):
        fp8quant.moe_dispatch_quant(x, tuple(r))
    with pytest.raises(ValueError, match=r"^x has 2 tokens but the routing was made for 3 "):
        fp8quant.moe_dispatch_quant(x[:2], r)
    with pytest.raises(ValueError, match=r"needs a routing made with max_m"):
        fp8quant.moe_dispatch_quant(x, R.moe_routing(TOPK, 4), layout="masked", max_m=3)
    with pytest.raises(ValueError, match=r"^align must be an int >= 1, got 0$"):
        fp8quant.moe_dispatch_quant(x, r, align=0)
    with pytest.raises(ValueError, match=r"^max_m=4 differs from the routing's max_m=3 "):
        fp8quant.moe_dispatch_quant(x, r, layout="masked", max_m=4)


@pytest.mark.parametrize("layout,max_m", [("contiguous", None), ("masked", 3)])
@pytest.mark.parametrize("tokens", [0, 2, 4, 6])
def test_dispatch_needs_the_routings_tokens(layout, max_m, tokens):
    """x holds exactly the T = 3 tokens the routing was made for: fewer would read past x (the
    reference raised IndexError; with every slot dropped nothing was read and the call passed),
    more would be ignored. Both raise ValueError naming x and the routing, the op and its
    reference alike, on either layout."""
    x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    for ids in (TOPK, torch.full_like(TOPK, -1)):
        r = R.moe_routing(ids, 4, align=4, max_m=3)
        for fn in (fp8quant.moe_dispatch_quant, R.moe_dispatch_quant):
            with pytest.raises(ValueError, match=rf"^x has {tokens} tokens but the routing was made for 3 \(x and"):
                fn(x, r, layout=layout, max_m=max_m)
    with pytest.raises(ValueError, match=rf"^slot_rows must be \[T, k\] for x's T = {tokens} tokens, got \(3, 2\)$"):
        R.moe_scatter_quant(x, r.inv_perm, (12,))


@pytest.mark.parametrize("scale_layout", ["row", "mn", "mn_tma", "packed_ue8m0"])
def test_dispatch_every_slot_dropped(scale_layout):
    """A routing that drops every slot (id -1, or experts of another rank): contiguous, no rows (or
    max_m_sum rows of padding); masked, [E, max_m, H] of padding. Padding is zero in the reference
    and the CPU path, q and scales alike (docs/contract.md, "Rows without a token")."""
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    for ids, offset in ((torch.full_like(TOPK, -1), 0), (TOPK.clamp(min=0), 4)):  # experts 0-3 on another rank
        for max_m_sum in (None, 16):
            for make in (R.moe_routing, fp8quant.moe_routing):
                r = make(ids, 4, expert_offset=offset, align=4, max_m=3, max_m_sum=max_m_sum)
                assert r.counts.tolist() == [0, 0, 0, 0] and r.inv_perm.tolist() == [[-1, -1]] * 3
                rows = 0 if max_m_sum is None else max_m_sum
                for layout, max_m, shape in (("contiguous", None, (rows, 256)), ("masked", 3, (4, 3, 256))):
                    for fn in (fp8quant.moe_dispatch_quant, R.moe_dispatch_quant):
                        q, s = fn(x, r, layout=layout, max_m=max_m, scale_layout=scale_layout)
                        assert q.shape == shape and s.shape[:-1] == shape[:-1]
                        assert not bool(q.view(torch.uint8).any()) and not bool(s.any())


def test_moe_quantizers_take_the_kernels_groups_on_the_cpu_too():
    """The GPU builds silu_mul_quant's and moe_dispatch_quant's sources for groups of 128 only: the
    CPU path refuses 32 and 64 with the C API's message, before either path; the references take them."""
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    r = R.moe_routing(TOPK, 4, align=4, max_m=3)
    for group_size in (32, 64):
        with pytest.raises(ValueError, match=rf"^group_size: must be 128 for silu_mul_quant, got {group_size}$"):
            fp8quant.silu_mul_quant(x, group_size)
        with pytest.raises(ValueError, match=rf"^group_size: must be 128 for moe_dispatch_quant, got {group_size}$"):
            fp8quant.moe_dispatch_quant(x, r, group_size)
        with pytest.raises(ValueError, match=rf"^group_size: must be 128 for moe_dispatch_quant, got {group_size}$"):
            fp8quant.moe_dispatch_quant(x, r, group_size, layout="masked", max_m=3)
        assert R.silu_mul_quant(x, group_size)[1].shape == (3, 128 // group_size)
        assert R.moe_dispatch_quant(x, r, group_size)[1].shape == (12, 256 // group_size)
    with pytest.raises(TypeError, match=r"^group_size must be an int, got float$"):
        fp8quant.silu_mul_quant(x, 128.0)


def test_silu_rows_past_m_sum_are_padding_on_the_cpu_too():
    """With row_offsets, a row past M_sum is padding whatever m_indices says (the kernel neither
    reads nor writes it); the CPU path writes it as zeros."""
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    m_indices = torch.tensor([0, 0, -1, -1, 1, 1], dtype=torch.int32)  # a stale id past M_sum = 4
    row_offsets = torch.tensor([0, 4], dtype=torch.int32)
    q, s = fp8quant.silu_mul_quant(x, m_indices=m_indices, row_offsets=row_offsets, scale_layout="row")
    rq, rs = R.silu_mul_quant(x, m_indices=torch.tensor([0, 0, -1, -1, -1, -1], dtype=torch.int32), scale_layout="row")
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    assert bool((s[4:] == 0).all()) and bool((s[:2] > 0).all())


@pytest.mark.parametrize(
    "t,k,e,align,want",
    [
        (1, 8, 256, 128, (1024, 1)),  # 8 slots, 8 experts each padded to 128 rows
        (16, 8, 256, 128, (16384, 16)),  # 128 slots: 128 + 128 * 127 rows
        (4096, 8, 256, 128, (65280, 4096)),  # 32768 + 256 * 127 = 65280 = 510 * 128
        (0, 8, 256, 128, (0, 1)),
        (3, 2, 4, 4, (20, 3)),  # 6 + 4 * 3 = 18, rounded to 20
    ],
)
def test_moe_bounds(t, k, e, align, want):
    assert tuple(fp8quant.moe_bounds(t, k, e, align=align)) == want


def test_moe_bounds_hold_every_routing():
    """The bounds hold random routings and are reached by the worst ones: every slot on its own
    expert (M_sum = T*k*128 when T*k <= E), and every token on expert 0 (T slots there)."""
    t, k, e = 16, 8, 256
    bounds = fp8quant.moe_bounds(t, k, e)
    spread = torch.arange(t * k, dtype=torch.int32).view(t, k)
    assert int(R.moe_routing(spread, e).row_offsets[-1]) == bounds.max_m_sum
    crowded = torch.cat([torch.zeros(t, 1, dtype=torch.int32), 1 + spread[:, 1:] % (e - 1)], 1)
    assert int(R.moe_routing(crowded, e).counts.max()) == bounds.max_m
    gen = torch.Generator().manual_seed(5)
    for t, k, e in ((1, 8, 256), (5, 2, 4), (16, 8, 256), (40, 8, 16)):
        bounds = fp8quant.moe_bounds(t, k, e)
        for _ in range(20):
            ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]).to(torch.int32)
            r = R.moe_routing(ids, e, max_m_sum=bounds.max_m_sum, max_m=bounds.max_m)  # raises if too small
            assert int(r.row_offsets[-1]) <= bounds.max_m_sum and int(r.counts.max()) <= bounds.max_m
    with pytest.raises(ValueError, match=r"^top_k must be an int >= 1, got 0$"):
        fp8quant.moe_bounds(4, 0, 8)
