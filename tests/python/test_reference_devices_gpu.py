"""The reference gives the same bytes on CUDA as on the CPU, for every op.

The GPU tests compare each kernel with ``fp8quant.reference`` run on the kernel's own (CUDA)
inputs, while the hand-computed values and torchao check the reference on the CPU. Both are
the oracle only if the reference's arithmetic does not depend on the device: PyTorch may
evaluate an expression differently on CUDA (``tensor / python_scalar`` becomes a multiply by
the reciprocal there, and elementwise kernels may contract multiply-adds). Here each reference
runs on the same inputs on both devices and must give identical bits: SiLU over every 16-bit
gate value, the norms, every quantizer (FP8, MXFP8 in both recipes, NVFP4), the weight and
scale transforms, and the MoE routing, dispatch and combine. The one exception is SiLU in
float32, whose ``exp`` is PyTorch's on each device (docs/contract.md, "MoE"): its values agree
to the last bits, and the kernels follow CUDA's. Marked ``gpu``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from gpu_harness import assert_bitwise_equal

from fp8quant import reference as R

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def spread(shape, dtype, seed: int) -> torch.Tensor:
    """Gaussian values whose groups of 16 span many magnitudes, with zeros, the largest finite
    values and subnormals mixed in (on the CPU)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    scale = torch.exp2(torch.randint(-14, 14, (*shape[:-1], -(-shape[-1] // 16), 1), generator=gen).float())
    x = x * scale.repeat_interleave(16, -1).flatten(-2)[..., : shape[-1]]
    flat = x.view(-1)
    info = torch.finfo(dtype)
    picks = torch.randint(0, flat.numel(), (4, max(1, flat.numel() // 200)), generator=gen)
    flat[picks[0]] = 0.0
    flat[picks[1]] = info.max
    flat[picks[2]] = -info.max
    flat[picks[3]] = info.smallest_normal / 4
    return x.to(dtype)


def every_16_bit_gate(dtype: torch.dtype) -> torch.Tensor:
    """``[512, 256]``: gates (the first 128 columns) of every bit pattern of ``dtype``, ups random."""
    gates = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int16).view(dtype).reshape(512, 128)
    ups = torch.randn(512, 128, generator=torch.Generator().manual_seed(7)).to(dtype)
    return torch.cat([gates, ups], dim=1)


def tensors_of(value) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in an op's result (tensors, tuples, named tuples), with a name."""
    if isinstance(value, torch.Tensor):
        return [("", value)]
    if value is None or isinstance(value, int | float):
        return []
    fields = getattr(value, "_fields", None)
    names = fields if fields is not None else [str(i) for i in range(len(value))]
    return [(f"{n}{'.' + sub if sub else ''}", t) for n, v in zip(names, value) for sub, t in tensors_of(v)]


def to_cuda(value):
    """CUDA copies of the tensors in ``value``, each with its strides and storage offset (a
    padded scale layout's view keeps its buffer)."""
    if isinstance(value, torch.Tensor):
        whole = value.as_strided((value.untyped_storage().nbytes() // value.element_size(),), (1,), 0)
        return whole.cuda().as_strided(value.shape, value.stride(), value.storage_offset())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_cuda(v) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(to_cuda(v) for v in value)
    if isinstance(value, dict):
        return {k: to_cuda(v) for k, v in value.items()}
    return value


def same_on_both_devices(op: Callable, *args, nan_bits: bool = True, **kwargs) -> None:
    """``op(*args, **kwargs)`` on CPU tensors and on their CUDA copies: identical bits, in the
    results and in the arguments the op updates in place (the residual). ``nan_bits=False``
    lets NaNs differ in sign and payload (PyTorch's CUDA and CPU kernels make different NaNs)."""

    def run(a, kw):  # the results, then the keyword tensors (which the op may update)
        return tensors_of(op(*a, **kw)) + tensors_of([v for v in kw.values() if isinstance(v, torch.Tensor)])

    cuda_args, cuda_kwargs = to_cuda(args), to_cuda(kwargs)  # before the CPU call updates any
    cpu, gpu = run(args, kwargs), run(cuda_args, cuda_kwargs)
    assert [n for n, _ in cpu] == [n for n, _ in gpu]
    assert cpu, "the op returned no tensor"
    for (name, c), (_, g) in zip(cpu, gpu):
        assert g.is_cuda and g.dtype == c.dtype
        g = g.cpu()
        if not nan_bits and c.dtype in DTYPES:
            both = c.isnan() & g.isnan()
            c, g = c.masked_fill(both, float("nan")), g.masked_fill(both, float("nan"))
        assert_bitwise_equal(g, c, f"{getattr(op, '__name__', op)} output {name or 0}: CUDA against CPU")


# --- Elementwise and norms ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_silu_and_mul_every_gate(dtype):
    """In 16-bit dtypes the rounding of SiLU to the dtype hides the last-bit differences of exp
    (below): every gate gives the same value on both devices; NaNs differ in sign and payload."""
    same_on_both_devices(R.silu_and_mul, every_16_bit_gate(dtype), nan_bits=False)


def test_silu_and_mul_float32():
    """SiLU is PyTorch's, whose exp is not correctly rounded and differs between CUDA and the CPU
    in the last bits (docs/contract.md, "MoE"); the kernels follow CUDA's. CUDA's expf is within
    2 units in the last place and the CPU's within 1, so the two exps differ by at most 3 ulps,
    a relative 3 * 2^-23 that SiLU passes on undiminished (x / (1 + e) is less sensitive to e
    than e is) and that is at most 6 ulps of the result; the roundings of 1 + e, the division
    and the product with up may each add one more. H200, torch 2.11: at most 4."""
    x = spread((1024, 512), torch.float32, 1) / 1e3
    c, g = R.silu_and_mul(x), R.silu_and_mul(x.cuda()).cpu()
    assert torch.equal(c.isnan(), g.isnan())
    finite = ~c.isnan()
    ulps = (c.view(torch.int32).long() - g.view(torch.int32).long())[finite].abs()
    assert int(ulps.max()) <= 9, f"{int((ulps > 9).sum())} values differ by more than 9 ulps (max {int(ulps.max())})"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_norms(dtype, residual):
    x = spread((67, 1024), dtype, 2) / 1e4
    w = spread((1024,), dtype, 3).clamp(-4, 4)
    kw = {"residual": spread((67, 1024), dtype, 4) / 1e4} if residual else {}
    same_on_both_devices(R.rms_norm, x, w, 1e-6, **kw)
    same_on_both_devices(R.rms_norm_quant, x, w, 1e-6, scale_layout="mn_tma", **kw)
    same_on_both_devices(R.rms_norm_quant, x, w, 1e-6, scale_layout="packed_ue8m0", **kw)
    for recipe in ("rceil", "floor"):
        same_on_both_devices(R.rms_norm_mxfp8, x, w, 1e-6, recipe=recipe, **kw)
    same_on_both_devices(R.rms_norm_nvfp4, x, w, torch.tensor(37.5), 1e-6, **kw)


# --- Quantizers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_quantizers(dtype):
    x = spread((3, 129, 640), dtype, 5)
    for layout, ue8m0 in (("row", False), ("mn_tma", True), ("packed_ue8m0", True)):
        same_on_both_devices(R.per_token_group_quant, x, 128, scale_layout=layout, ue8m0=ue8m0)
    same_on_both_devices(R.per_token_group_quant, x, 32, scale_layout="mn", eps=1e-4)
    if dtype == torch.float32:
        return  # float32 SiLU differs in the last bits between the devices (above), and so do fp32 scales of it
    y = torch.cat([spread((129, 640), dtype, 6) / 1e3, spread((129, 640), dtype, 7) / 1e3], dim=-1)
    same_on_both_devices(R.silu_mul_quant, y, scale_layout="mn_tma")
    same_on_both_devices(R.silu_mul_quant, y, scale_layout="packed_ue8m0")


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_scaled_quantizers(dtype):
    x = spread((2, 131, 1056), dtype, 8)
    for recipe in ("rceil", "floor"):
        for layout in ("swizzled", "row"):
            same_on_both_devices(R.mxfp8_quant, x, recipe=recipe, scale_layout=layout)
    same_on_both_devices(R.nvfp4_global_scale, x)
    same_on_both_devices(R.nvfp4_global_scale, x, per_batch=True)
    for layout in ("swizzled", "row"):
        same_on_both_devices(R.nvfp4_quant, x, scale_layout=layout)
        same_on_both_devices(R.nvfp4_quant, x, torch.tensor([0.75, 1200.0]), scale_layout=layout)
    y = spread((131, 2112), dtype, 9) / 1e3
    same_on_both_devices(R.silu_mul_mxfp8, y)
    same_on_both_devices(R.silu_mul_nvfp4, y, torch.tensor(300.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_weights_and_scale_transforms(dtype):
    w = spread((300, 520), dtype, 10)
    same_on_both_devices(R.per_block_quant, w)
    same_on_both_devices(R.per_block_quant, w, ue8m0=True)
    q, s = R.per_block_quant(w)
    same_on_both_devices(R.requantize_ue8m0, q, s)
    same_on_both_devices(R.sm100_weight_scales, R.requantize_ue8m0(q, s)[1], 300)
    _, scale = R.per_token_group_quant(spread((129, 640), dtype, 11), 128, scale_layout="mn_tma")
    same_on_both_devices(R.convert_scales, scale, "mn_tma", "row")
    same_on_both_devices(R.ue8m0_round_up, scale)
    _, powers = R.per_token_group_quant(spread((129, 640), dtype, 11), 128, scale_layout="mn_tma", ue8m0=True)
    same_on_both_devices(R.pack_ue8m0, powers, "mn_tma")
    same_on_both_devices(R.unpack_ue8m0, R.pack_ue8m0(powers, "mn_tma"), 5)


# --- MoE ------------------------------------------------------------------------------------------


def routed(t: int, k: int, e: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(t, e, generator=gen).topk(k, dim=1).indices.to(torch.int32)
    ids[torch.rand(t, k, generator=gen) < 0.05] = -1  # some dropped slots
    return ids


def test_moe():
    t, k, e, h = 97, 8, 16, 512
    ids = routed(t, k, e, 12)
    same_on_both_devices(R.moe_routing, ids, e)
    same_on_both_devices(R.moe_routing, ids, e, max_m_sum=4096, max_m=t)
    routing = R.moe_routing(ids, e, max_m_sum=4096, max_m=t)
    x = spread((t, h), torch.bfloat16, 13)
    same_on_both_devices(R.moe_dispatch_quant, x, routing)
    same_on_both_devices(R.moe_dispatch_quant, x, routing, layout="masked", max_m=t, scale_layout="packed_ue8m0")
    scales = torch.linspace(0.5, 900.0, e)
    same_on_both_devices(R.moe_dispatch_nvfp4, x, routing, scales)
    same_on_both_devices(R.moe_dispatch_nvfp4, x, routing, scales, layout="masked", max_m=t)
    y = spread((4096, h), torch.bfloat16, 14) / 1e3
    weights = torch.rand(t, k, generator=torch.Generator().manual_seed(15))
    same_on_both_devices(R.moe_combine, y, routing.inv_perm, weights)
    y1 = spread((4096, 2 * h), torch.bfloat16, 16) / 1e3
    same_on_both_devices(R.silu_mul_quant, y1, m_indices=routing.m_indices)
    same_on_both_devices(R.silu_mul_nvfp4, y1, scales, m_indices=routing.m_indices)
    ym = spread((e, t, 2 * h), torch.bfloat16, 17) / 1e3
    same_on_both_devices(R.silu_mul_mxfp8, ym, masked_m=routing.counts)
    same_on_both_devices(R.silu_mul_nvfp4, ym, scales, masked_m=routing.counts)
