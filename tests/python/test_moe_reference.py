"""The MoE references (fp8quant.reference: moe_routing, moe_dispatch_quant, silu_and_mul,
silu_mul_quant, moe_combine) against layouts and values written out by hand; the oracles the MoE
kernels will be tested against (docs/contract.md, "MoE")."""

from __future__ import annotations

import pytest
import torch

from fp8quant import reference as R

# T = 3 tokens, k = 2, E = 4 local experts, rows aligned to 4. Flat slots s = t * k + j:
# s0 (t0, e1), s1 (t0, e3), s2 (t1, e1), s3 dropped, s4 (t2, e0), s5 (t2, e1).
TOPK = torch.tensor([[1, 3], [1, -1], [0, 1]], dtype=torch.int32)


def test_routing_by_hand():
    r = R.moe_routing(TOPK, 4, align=4, max_m=3)
    assert r.counts.tolist() == [1, 3, 0, 1]
    assert r.row_offsets.tolist() == [0, 4, 8, 8, 12]  # aligned counts 4, 4, 0, 4
    assert r.m_indices.tolist() == [0, -1, -1, -1, 1, 1, 1, -1, 3, -1, -1, -1]
    assert r.row_token.tolist() == [2, -1, -1, -1, 0, 1, 2, -1, 0, -1, -1, -1]
    assert r.inv_perm.tolist() == [[4, 8], [5, -1], [0, 6]]
    assert r.masked_row.tolist() == [[3, 9], [4, -1], [0, 5]]  # e * max_m + rank
    assert all(t.dtype == torch.int32 for t in r[:6] if t is not None)


def test_routing_local_range_bounds_and_int64():
    ids = torch.tensor([[2, 5], [3, 0], [-1, 2]], dtype=torch.int64)  # experts 2 and 3 are local
    r = R.moe_routing(ids, 2, expert_offset=2, align=2, max_m_sum=8)
    assert r.counts.tolist() == [2, 1]
    assert r.m_indices.tolist() == [0, 0, 1, -1, -1, -1, -1, -1]  # rows past M_sum = 4 are padding
    assert r.row_token.tolist() == [0, 2, 1, -1, -1, -1, -1, -1]
    assert r.inv_perm.tolist() == [[0, -1], [2, -1], [-1, 1]]
    with pytest.raises(ValueError, match=r"^max_m_sum=3 is smaller than M_sum=4"):
        R.moe_routing(ids, 2, expert_offset=2, align=2, max_m_sum=3)
    with pytest.raises(ValueError, match=r"^max_m=1 is smaller than the 2 slots of the busiest expert$"):
        R.moe_routing(ids, 2, expert_offset=2, max_m=1)


def test_routing_empty_and_errors():
    r = R.moe_routing(torch.empty(0, 8, dtype=torch.int32), 256)
    assert r.counts.shape == (256,) and int(r.counts.sum()) == 0 and r.m_indices.numel() == 0
    assert r.inv_perm.shape == (0, 8)
    with pytest.raises(TypeError, match=r"^topk_ids must be an int32 or int64 tensor \[T, k\]$"):
        R.moe_routing(torch.zeros(3, 2), 4)
    with pytest.raises(ValueError, match=r"^align must be an int >= 1, got 0$"):
        R.moe_routing(TOPK, 4, align=0)


def test_routing_properties_at_scale():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(-1, 256, (4096, 8), generator=g, dtype=torch.int32)
    r = R.moe_routing(ids, 256, align=128, max_m=4096)
    valid = ids >= 0
    assert int(r.counts.sum()) == int(valid.sum())
    assert bool((r.row_offsets % 128 == 0).all())
    rows = r.inv_perm[valid].long()
    assert rows.unique().numel() == rows.numel()  # every slot its own row
    assert torch.equal(r.m_indices[rows], ids[valid])  # the row's expert is the slot's
    assert torch.equal(r.row_token[rows].long(), valid.nonzero()[:, 0])
    assert int((r.m_indices >= 0).sum()) == rows.numel()


def test_dispatch_contiguous_and_masked():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 256, generator=g).to(torch.bfloat16)
    r = R.moe_routing(TOPK, 4, align=4, max_m=3)
    q, s = R.moe_dispatch_quant(x, r, 128, scale_layout="mn_tma")
    rows = torch.stack([x[t] if t >= 0 else torch.zeros_like(x[0]) for t in r.row_token.tolist()])
    rq, rs = R.per_token_group_quant(rows, 128, scale_layout="mn_tma")
    pad = r.m_indices < 0
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and not bool(q[pad].float().any())
    assert torch.equal(s[~pad], rs[~pad]) and not bool(s[pad].any())  # padding scales 0, not eps / 448

    qm, sm = R.moe_dispatch_quant(x, r, 128, layout="masked", max_m=3, scale_layout="packed_ue8m0")
    assert qm.shape == (4, 3, 256) and sm.shape == (4, 3, 1) and sm.stride() == (4, 1, 4)
    rq2, _ = R.per_token_group_quant(x[2:3], 128, scale_layout="packed_ue8m0")  # expert 1's third slot: t2
    assert torch.equal(qm[1, 2].view(torch.uint8), rq2[0].view(torch.uint8))
    assert not bool(qm[2].float().any()) and not bool(sm[2].any()) and not bool(sm[0, 1:].any())


def test_silu_and_mul_rounds_like_torch():
    x = torch.tensor([[1.0, -3.5, 2.0, 0.1]], dtype=torch.bfloat16)
    y = R.silu_and_mul(x)
    gate, up = x[:, :2].float(), x[:, 2:].float()
    silu = (gate / (1 + torch.exp(-gate))).to(torch.bfloat16).float()
    assert torch.equal(y, (silu * up).to(torch.bfloat16))
    assert y.dtype == torch.bfloat16 and y.shape == (1, 2)


def test_silu_and_mul_hand_values():
    """x = [[1, -3.5, 2, 0.5]]: gate [1, -3.5], up [2, 0.5].

    silu(1) = 1 / (1 + e^-1) = 0.7310585786...; silu(-3.5) = -3.5 / (1 + e^3.5) = -0.1025928076...

    bfloat16: silu rounded to the dtype: 0.73105858 * 2^8 = 187.15 -> 187 * 2^-8 = 0.73046875;
    0.10259281 * 2^11 = 210.11 -> -210 * 2^-11 = -0.1025390625 (both far from a tie: float32's
    error cannot move them). The products by 2 and 0.5 are exact: 1.4609375, -0.05126953125.

    float32: RN32(silu(1)) = 12265128 * 2^-24 (0.7310585786 * 2^24 = 12265127.68) and
    RN32(silu(-3.5)) = -13769774 * 2^-27 (13769773.55); times 2 and 0.5 exactly. torch's float32
    exp is not correctly rounded on every build and the second value is 0.05 ulp from a tie, so
    float32 is held to one ulp."""
    x = torch.tensor([[1.0, -3.5, 2.0, 0.5]])
    y = R.silu_and_mul(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16 and y.float().tolist() == [[1.4609375, -0.05126953125]]
    y = R.silu_and_mul(x)
    want = torch.tensor([[12265128 * 2.0**-23, -13769774 * 2.0**-28]])
    assert y.dtype == torch.float32 and ((y - want).abs() <= torch.tensor([[2.0**-23, 2.0**-28]])).all()


def test_dispatch_refuses_another_max_m():
    """masked_row encodes a slot's row as e * routing.max_m + rank: dispatching into another max_m
    misplaced rows silently (docs/contract.md: dispatch refuses another); the public op refused."""
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    r = R.moe_routing(TOPK, 4, max_m=5)
    message = r"^max_m=8 differs from the routing's max_m=5 \(masked_row encodes it\)$"
    with pytest.raises(ValueError, match=message):
        R.moe_dispatch_quant(x, r, layout="masked", max_m=8)
    with pytest.raises(ValueError, match=message):
        R.moe_dispatch_nvfp4(x, r, torch.tensor(1.0), layout="masked", max_m=8)
    assert R.moe_dispatch_quant(x, r, layout="masked", max_m=5)[0].shape == (4, 5, 128)
    assert R.moe_dispatch_nvfp4(x, r, torch.tensor(1.0), layout="masked", max_m=5)[0].shape == (4, 5, 64)


@pytest.mark.parametrize("scale_layout", ["row", "mn_tma", "packed_ue8m0"])
def test_silu_mul_quant_plain_contiguous_masked(scale_layout):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 512, generator=g).to(torch.bfloat16)
    q, s = R.silu_mul_quant(x, scale_layout=scale_layout)
    rq, rs = R.per_token_group_quant(R.silu_and_mul(x), scale_layout=scale_layout)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)

    m_indices = torch.tensor([0, 0, -1, 1, -1, -1], dtype=torch.int32)
    x[m_indices < 0] = float("nan")  # padding rows are never read
    q, s = R.silu_mul_quant(x, scale_layout=scale_layout, m_indices=m_indices)
    assert torch.equal(q[3].view(torch.uint8), rq[3].view(torch.uint8))
    assert not bool(q[2].float().any()) and not bool(s[2].any()) and not bool(s[5].any())

    xm = torch.randn(2, 4, 512, generator=g).to(torch.bfloat16)
    xm[0, 1:] = float("nan")
    qm, sm = R.silu_mul_quant(xm, scale_layout=scale_layout, masked_m=torch.tensor([1, 4]))
    rq, rs = R.per_token_group_quant(R.silu_and_mul(xm[1]), scale_layout=scale_layout)
    assert torch.equal(qm[1].view(torch.uint8), rq.view(torch.uint8)) and torch.equal(sm[1], rs)
    assert not bool(qm[0, 1:].float().any()) and not bool(sm[0, 1:].any())


def test_combine_by_hand_and_masked_form():
    r = R.moe_routing(TOPK, 4, align=4, max_m=3)
    y = torch.arange(12 * 2, dtype=torch.float32).view(12, 2).to(torch.bfloat16)  # row i holds 2i, 2i+1
    w = torch.tensor([[0.5, 0.25], [2.0, 7.0], [1.0, -1.0]])
    out = R.moe_combine(y, r.inv_perm, w)
    # t0: 0.5 * y[4] + 0.25 * y[8]; t1: 2 * y[5] (its second slot is dropped); t2: y[0] - y[6]
    assert out.tolist() == [[0.5 * 8 + 0.25 * 16, 0.5 * 9 + 0.25 * 17], [20.0, 22.0], [0.0 - 12, 1.0 - 13]]
    assert out.dtype == torch.bfloat16
    # The same expert outputs in the masked layout give the same result
    ym = torch.zeros(4 * 3, 2, dtype=torch.bfloat16)
    valid = r.inv_perm >= 0
    ym[r.masked_row[valid].long()] = y[r.inv_perm[valid].long()]
    assert torch.equal(R.moe_combine(ym.view(4, 3, 2), r.masked_row, w), out)


def test_combine_accumulates_in_float32_in_slot_order():
    """Products and sums rounded in float32, one rounding to bf16 at the end."""
    y = torch.tensor([[1.0], [2.0**-9], [2.0**-9]], dtype=torch.bfloat16)
    rows = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    out = R.moe_combine(y, rows, torch.ones(1, 3))
    assert out.item() == torch.tensor(1.0 + 2.0**-8).to(torch.bfloat16).item()  # not 1 + (bf16 tie) twice
