"""The NVFP4 reference (fp8quant.reference.nvfp4, docs/contract.md "NVFP4"): e2m1 rounding at
every midpoint, nibble order, the scales of the canonical IEEE recipe by hand, zero and non-finite
groups, per-expert global scales, the swizzled scales, and the bound against torchao 0.18 on the
CPU (its recipe divides differently, so it is compared by error, not by bytes)."""

from __future__ import annotations

import pytest
import torch

from fp8quant.reference import nvfp4
from fp8quant.reference.mx import from_swizzled

F32 = torch.float32


def codes(values):
    return nvfp4.e2m1_codes(torch.tensor(values, dtype=F32)).tolist()


def test_e2m1_rounding_by_hand():
    """Exact values map to their codes; midpoints go to the even code (0.25 -> 0, 0.75 -> 1.0,
    1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0); past 6 (inf too) saturates; the
    sign is bit 3, negative zero included; NaN becomes +6."""
    assert codes(list(nvfp4.E2M1_VALUES)) == list(range(8))
    assert codes([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) == [0, 2, 2, 4, 4, 6, 6]
    assert codes([0.2500001, 0.7499999, 5.0000005, 7.0, float("inf")]) == [1, 1, 7, 7, 7]
    assert codes([-0.5, -6.0, -0.0, -0.1, float("-inf"), float("nan")]) == [9, 15, 8, 8, 15, 7]


def test_e2m1_is_nearest_even_everywhere():
    """Every value a multiple of 1/64 in [-8, 8]: the code's value is a nearest e2m1 value, and on
    a tie the one with an even code."""
    y = torch.arange(-512, 513, dtype=F32) / 64
    c = nvfp4.e2m1_codes(y)
    grid = torch.tensor(nvfp4.E2M1_VALUES, dtype=F32)
    got = grid[(c & 7).long()]
    dist = (y.abs().clamp(max=6).unsqueeze(1) - grid).abs()
    best = dist.min(dim=1).values
    assert torch.equal((got - y.abs().clamp(max=6)).abs(), best)
    ties = (dist == best.unsqueeze(1)).sum(1) > 1
    assert ((c[ties] & 1) == 0).all()


def test_quant_by_hand():
    """One row, global scale 1 given: group 0 has amax 6 -> s = e4m3(1.0) = 1, factor 1, elements
    as they are; group 1 amax 12 -> s = 2, elements halved (3 -> 1.5, -12 -> -6); an all-zero
    group gets scale 0 and zero codes. Nibbles: element 2i low."""
    x = torch.zeros(1, 48, dtype=F32)
    x[0, :4] = torch.tensor([6.0, 0.5, -1.0, 3.0])
    x[0, 16:19] = torch.tensor([3.0, -12.0, 0.7])
    q, s, g = nvfp4.nvfp4_quant(x, torch.tensor(1.0), scale_layout="row")
    assert s.float().tolist() == [[1.0, 2.0, 0.0]] and g.item() == 1.0
    assert q[0, :2].tolist() == [0x7 | (0x1 << 4), 0xA | (0x5 << 4)]  # (6, 0.5), (-1, 3)
    assert q[0, 8:10].tolist() == [0x3 | (0xF << 4), 0x1]  # (1.5, -6), (0.35 -> 0.5, 0)
    assert q[0, 16:].eq(0).all()


def test_global_scale_and_its_ends():
    """S = RN(2688 / amax) over finite elements; 1 for an all-zero tensor; per batch with
    per_batch; the largest float32 for a subnormal amax."""
    x = torch.zeros(2, 1, 16, dtype=F32)
    x[0, 0, 0], x[1, 0, 3] = 448.0, float("inf")
    x[1, 0, 1] = -7.0
    assert nvfp4.nvfp4_global_scale(x).item() == 6.0
    assert nvfp4.nvfp4_global_scale(x, per_batch=True).tolist() == [6.0, pytest.approx(2688 / 7, rel=1e-7)]
    assert nvfp4.nvfp4_global_scale(torch.zeros(3, 16)).item() == 1.0
    assert nvfp4.nvfp4_global_scale(torch.full((1, 16), 1e-45)).item() == torch.finfo(F32).max


def test_per_expert_global_scales_and_swizzle():
    """A 3-D x with a global scale per expert equals quantizing each expert alone with its own; the
    swizzled scales hold the row-major ones."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 130, 64, generator=gen).to(torch.bfloat16) * torch.tensor([1.0, 100.0, 1e-3]).view(3, 1, 1)
    g = nvfp4.nvfp4_global_scale(x, per_batch=True)
    q, s, _ = nvfp4.nvfp4_quant(x, g)
    assert q.shape == (3, 130, 32) and s.shape == (3, 256, 4)
    for e in range(3):
        qe, se, _ = nvfp4.nvfp4_quant(x[e], g[e], scale_layout="row")
        assert torch.equal(q[e], qe)
        assert torch.equal(from_swizzled(s[e].view(torch.uint8), 130, 4), se.view(torch.uint8))


def test_round_trip_error():
    """dequant(quant(x)) of Gaussian rows: every element within half an e2m1 step of its group's
    scale (0.5 * s / S near 0, up to 1 * s / S at the top), plus the e4m3 rounding of s."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=gen)
    q, s, g = nvfp4.nvfp4_quant(x)
    back = nvfp4.nvfp4_dequant(q, s, g)
    step = from_swizzled(s.view(torch.uint8), 64, 16).view(torch.float8_e4m3fn).float().repeat_interleave(16, -1) / g
    assert ((back - x).abs() <= step * 1.0 + 1e-6).all()
    rel = (back - x).norm() / x.norm()
    assert rel < 0.12


# --- against torchao 0.18 on the CPU ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_torchao(dtype, seed):
    """torchao's nvfp4_quantize (two-level, per_tensor_scale = amax / 2688) on rows of very
    different magnitudes. Where a group's canonical scale is an e4m3 normal (>= 2^-6) the scale
    bytes are equal, and the element bytes equal but for the few its reciprocal multiply rounds
    otherwise (< 1%); below, torchao clamps the scale to 2^-6 (byte 8), zero groups included, where
    the recipe keeps e4m3's subnormals and 0. Both round trips err alike on the normal groups."""
    pytest.importorskip("torchao", minversion="0.18")
    from torchao.prototype.mx_formats import nvfp4_tensor  # noqa: PLC0415

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(256, 1024, generator=gen) * torch.exp(3 * torch.randn(256, 1, generator=gen))).to(dtype)
    x[0, :16] = 0
    q, s, g = nvfp4.nvfp4_quant(x, scale_layout="row")
    s_ref, q_ref = nvfp4_tensor.nvfp4_quantize(x, 16, x.float().abs().amax() / 2688)
    ours, theirs = s.view(torch.uint8), s_ref.view(torch.uint8)
    normal = ours >= 8
    assert normal.float().mean() > 0.1 and (~normal).any()
    assert torch.equal(ours[normal], theirs[normal])
    assert (theirs[~normal] == 8).all()
    q_groups, q_ref_groups = q.unflatten(-1, (-1, 8)), q_ref.view(torch.uint8).unflatten(-1, (-1, 8))
    differ = (q_groups != q_ref_groups)[normal].float().mean().item()
    assert differ < 0.01, f"{differ:.4f} of the element bytes differ"
    back = nvfp4.nvfp4_dequant(q, s, g, scale_layout="row").unflatten(-1, (-1, 16))[normal]
    codes_ref = torch.stack((q_ref_groups & 0xF, q_ref_groups >> 4), -1).flatten(-2)[normal]
    back_ref = nvfp4.e2m1_value(codes_ref) * s_ref.float()[normal].unsqueeze(-1) / g
    x_normal = x.float().unflatten(-1, (-1, 16))[normal]
    assert abs((back - x_normal).norm() / (back_ref - x_normal).norm() - 1) < 0.02
