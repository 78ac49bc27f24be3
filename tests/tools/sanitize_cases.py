"""Representative kernel launches for compute-sanitizer (memcheck, racecheck, initcheck).

Run with the caching allocator off, so that every tensor is its own allocation and a stray
access lands outside it:

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python tests/tools/sanitize_cases.py

Every layout, dtype and group size, odd and padded M, odd G, 3-D input and the unaligned path,
the weight quantizer's partial blocks, dtypes, UE8M0 and strided experts, requantization, and
every scale transform (layouts, pack, unpack, SM100 weight scales, batched), the MoE combine
(dropped slots, unaligned H) and routing (bounds too small included), MXFP8 (both recipes and
layouts, 3-D and unaligned) and NVFP4 (per-expert encode scales), with programmatic
dependent launch on and then off; each result is also compared with the
reference, so the run fails on wrong bytes too.
"""

import itertools
import sys

import torch

import fp8quant

FORMATS = fp8quant.SCALE_FORMATS


def check(x: torch.Tensor, group_size: int, layout: str, ue8m0: bool) -> bool:
    q, s = fp8quant.per_token_group_quant(x, group_size, scale_layout=layout, ue8m0=ue8m0)
    rq, rs = fp8quant.reference.per_token_group_quant(x, group_size, scale_layout=layout, ue8m0=ue8m0)
    numel = fp8quant.scale_spec(layout, x.shape[-2], x.shape[-1] // group_size, tuple(x.shape[:-2])).numel
    same_q = torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    same_s = torch.equal(
        s.as_strided((numel,), (1,)).view(torch.int32), rs.as_strided((numel,), (1,)).view(torch.int32)
    )
    return same_q and same_s


def main() -> int:
    failures = cases = 0
    for pdl in (True, False):
        fp8quant.set_pdl(pdl)
        n, f = run_cases()
        cases, failures = cases + n, failures + f
    fp8quant.set_pdl(True)
    print(f"{cases} cases, {failures} mismatches")
    return 1 if failures else 0


def run_cases() -> tuple[int, int]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    failures = 0
    cases = 0
    for (layout, ue8m0), dtype, group_size, m in itertools.product(
        FORMATS, (torch.bfloat16, torch.float16, torch.float32), (32, 64, 128), (1, 5, 129)
    ):
        k = 3 * 128  # G odd for every group size
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        failures += not check(x, group_size, layout, ue8m0)
        cases += 1
    for layout, ue8m0 in FORMATS:
        x3 = torch.randn(3, 5, 640, device="cuda", generator=gen).to(torch.bfloat16)
        unaligned = torch.randn(7, 1 + 384, device="cuda", generator=gen).to(torch.bfloat16)[:, 1:]
        failures += not check(x3, 128, layout, ue8m0)
        failures += not check(unaligned, 128, layout, ue8m0)
        cases += 2
    for dtype, ue8m0, (n, k) in itertools.product(
        (torch.bfloat16, torch.float16, torch.float32), (False, True), ((1, 1), (130, 200), (129, 389))
    ):
        w = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
        failures += not check_weights(w, ue8m0)
        cases += 1
    strided = torch.randn(3, 200, 1 + 256, device="cuda", generator=gen).to(torch.bfloat16)[:, :, 1:]
    failures += not check_weights(strided, False)
    cases += 1
    for n, k in ((1, 1), (130, 200), (129, 389), (300, 7168)):
        failures += not check_requantize(torch.randn(n, k, device="cuda", generator=gen))
        cases += 1
    for shape in ((1, 1), (5, 3), (129, 7), (2, 130, 56)):
        failures += not check_transforms(shape, gen)
        cases += 1
    for t, k, h in ((1, 1, 8), (7, 2, 100), (300, 8, 7168)):
        failures += not check_combine(t, k, h, gen)
        cases += 1
    silu_shapes = (((3, 2 * 384), "mn_tma"), ((129, 2 * 512), "packed_ue8m0"), ((4, 33, 2 * 256), "row"))
    decode_shapes = (((4, 1, 2 * 2048), "mn_tma"), ((4, 3, 2 * 7168), "packed_ue8m0"))  # max_m <= 4: decode
    for shape, layout in silu_shapes + decode_shapes:
        failures += not check_silu(shape, layout, gen)
        cases += 1
    for t, k, e, layout in ((1, 1, 8, "mn_tma"), (7, 2, 8, "packed_ue8m0"), (300, 8, 32, "row")):
        failures += not check_dispatch(t, k, e, layout, gen)
        cases += 1
    # One kernel up to 512 experts below 16384 slots, two chunk kernels from 16384 (the last case's
    # chunks hold 1056 slots), two kernels past 512 experts; the third and the fifth overflow both
    # bounds
    for t, k, e, rows, max_m in (
        (0, 8, 8, 0, 0),
        (7, 2, 8, 2000, 14),
        (4096, 8, 256, 20000, 60),
        (5, 8, 513, 70000, 5),
        (8192, 8, 16, 30000, 100),
        (131073, 1, 256, 131073 + 256 * 127, 1024),
    ):
        failures += not check_routing(t, k, e, rows, max_m, gen)
        cases += 1
    for m, h, layout, residual in (
        (1, 128, "packed_ue8m0", True),
        (5, 7168, "mn_tma", False),
        (130, 16384, "row", True),
    ):
        failures += not check_norm(m, h, layout, residual, gen)
        cases += 1
    for shape, recipe, layout in (((1, 32), "rceil", "swizzled"), ((129, 96), "floor", "swizzled"),
                                  ((3, 5, 64), "rceil", "row"), ((7, 1 + 256), "floor", "row")):  # fmt: skip
        x = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
        x = x[..., 1:] if shape[-1] % 32 else x
        failures += not check_mx(x, recipe, layout)
        failures += not check_fp4(x, layout)
        cases += 2
    for shape, layout in (((37, 2 * 96), "swizzled"), ((4, 33, 2 * 64), "row"), ((200, 2 * 512), "swizzled")):
        failures += not check_block_scaled_silu(shape, layout, gen)
        cases += 2
    for t, k, e, layout in ((7, 2, 8, "swizzled"), (300, 8, 64, "row"), (1, 8, 256, "swizzled")):
        failures += not check_dispatch_nvfp4(t, k, e, layout, gen)
        cases += 1
    for m, h, layout, residual in ((1, 96, "swizzled", True), (130, 16384, "row", False), (5, 7168, "swizzled", True)):
        failures += not check_block_scaled_norm(m, h, layout, residual, gen)
        cases += 2
    torch.cuda.synchronize()
    return cases, failures


def check_fp4(x: torch.Tensor, layout: str) -> bool:
    g = fp8quant.nvfp4_global_scale(x, per_batch=x.dim() == 3)
    got = fp8quant.nvfp4_quant(x, g, scale_layout=layout)[:2]
    ref = fp8quant.reference.nvfp4_quant(x, g, scale_layout=layout)[:2]
    return all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, ref))


def check_mx(x: torch.Tensor, recipe: str, layout: str) -> bool:
    got = fp8quant.mxfp8_quant(x, recipe=recipe, scale_layout=layout)
    ref = fp8quant.reference.mxfp8_quant(x, recipe=recipe, scale_layout=layout)
    return all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, ref))


def check_weights(w: torch.Tensor, ue8m0: bool) -> bool:
    q, s = fp8quant.per_block_quant(w, ue8m0=ue8m0)
    rq, rs = fp8quant.reference.per_block_quant(w, ue8m0=ue8m0)
    return torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(
        s.view(torch.int32), rs.view(torch.int32)
    )


def check_requantize(w: torch.Tensor) -> bool:
    q, s = fp8quant.per_block_quant(w)
    q2, s2 = fp8quant.requantize_ue8m0(q, s)
    rq, rs = fp8quant.reference.requantize_ue8m0(q, s)
    return torch.equal(q2.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s2, rs)


def check_combine(t: int, k: int, h: int, gen) -> bool:
    ids = torch.randint(-1, 16, (t, k), device="cuda", generator=gen, dtype=torch.int32)
    routing = fp8quant.reference.moe_routing(ids, 8, expert_offset=4, align=128)
    y = torch.randn(routing.m_indices.numel(), h, device="cuda", generator=gen).to(torch.bfloat16)
    weights = torch.rand(t, k, device="cuda", generator=gen)
    got = fp8quant.moe_combine(y, routing.inv_perm, weights)
    return torch.equal(got, fp8quant.reference.moe_combine(y, routing.inv_perm, weights))


def check_routing(t: int, k: int, e: int, rows: int, max_m: int, gen) -> bool:
    """Routing against the reference; with bounds too small, that nothing is written past them."""
    ids = torch.randint(-1, 2 * e, (t, k), device="cuda", generator=gen, dtype=torch.int32)
    r = fp8quant.moe_routing(ids, e, expert_offset=e // 2, max_m_sum=rows, max_m=max_m or None, validate=False)
    try:
        ref = fp8quant.reference.moe_routing(ids, e, expert_offset=e // 2, max_m_sum=rows, max_m=max_m or None)
    except ValueError:
        return r.inv_perm.numel() == 0 or int(r.inv_perm.max()) < rows  # overflow: the kernels stayed in bounds
    return all(torch.equal(a, b) for a, b in zip(r[:6], ref[:6]) if a is not None)


def silu_rows(shape, gen) -> tuple[torch.Tensor, dict]:
    """x of the SiLU cases and its MoE rows: m_indices (2-D; padding rows hold NaN) or masked_m."""
    x = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    if x.dim() == 2:
        m_indices = torch.arange(shape[0], device="cuda", dtype=torch.int32) % 3 - 1
        x[m_indices < 0] = float("nan")
        return x, {"m_indices": m_indices}
    counts = torch.tensor([0, 5, 33, 17], device="cuda", dtype=torch.int32)[: shape[0]].clamp_(max=shape[1])
    return x, {"masked_m": counts}


def check_silu(shape, layout: str, gen) -> bool:
    """SiLU-and-mul + quantize, with padding rows (m_indices or masked_m) holding NaN."""
    x, kwargs = silu_rows(shape, gen)
    q, s = zeroed(fp8quant.silu_mul_quant(x, scale_layout=layout, **kwargs))
    fp8quant.silu_mul_quant(x, scale_layout=layout, **kwargs, out=(q, s))  # rows without tokens stay 0
    rq, rs = fp8quant.reference.silu_mul_quant(x, scale_layout=layout, **kwargs)
    return torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)


def check_block_scaled_silu(shape, layout: str, gen) -> bool:
    """SiLU-and-mul into MXFP8 and NVFP4 (per-expert encode scales), padding rows holding NaN."""
    x, kwargs = silu_rows(shape, gen)
    experts = 2 if x.dim() == 2 else shape[0]  # m_indices holds 0 and 1
    g = torch.rand(experts, device="cuda", generator=gen) * 500 + 1
    ok = True
    for run, ref in (
        (lambda **o: fp8quant.silu_mul_mxfp8(x, scale_layout=layout, **kwargs, **o),
         lambda: fp8quant.reference.silu_mul_mxfp8(x, scale_layout=layout, **kwargs)),
        (lambda **o: fp8quant.silu_mul_nvfp4(x, g, scale_layout=layout, **kwargs, **o),
         lambda: fp8quant.reference.silu_mul_nvfp4(x, g, scale_layout=layout, **kwargs)),
    ):  # fmt: skip
        q, s = zeroed(run())
        run(out=(q, s))  # rows without tokens stay 0
        ok &= all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip((q, s), ref()))
    return bool(ok)


def check_block_scaled_norm(m: int, h: int, layout: str, residual: bool, gen) -> bool:
    """rms_norm_mxfp8 and rms_norm_nvfp4 against their references, the residual updated in place."""
    x = torch.randn(m, h, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(h, device="cuda", generator=gen).to(torch.bfloat16)
    res0 = torch.randn(m, h, device="cuda", generator=gen).to(torch.bfloat16) if residual else None
    g = torch.tensor(200.0, device="cuda")
    ok = True
    for op, ref in (
        (lambda r: fp8quant.rms_norm_mxfp8(x, w, residual=r, scale_layout=layout),
         lambda: fp8quant.reference.rms_norm_mxfp8(x, w, residual=res0, scale_layout=layout)),
        (lambda r: fp8quant.rms_norm_nvfp4(x, w, g, residual=r, scale_layout=layout),
         lambda: fp8quant.reference.rms_norm_nvfp4(x, w, g, residual=res0, scale_layout=layout)),
    ):  # fmt: skip
        got = op(None if res0 is None else res0.clone())
        ok &= all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, ref(), strict=True))
    return bool(ok)


def zeroed(outs):
    """Outputs whose whole buffers are 0: where an MoE op writes nothing (rows without tokens),
    they then hold the zeros the reference writes there."""
    for t in outs:
        t.untyped_storage().fill_(0)
    return outs


def check_dispatch(t: int, k: int, e: int, layout: str, gen) -> bool:
    """Dispatch + quantize in both MoE layouts, with dropped slots and experts of other ranks."""
    ids = torch.randint(-1, 2 * e, (t, k), device="cuda", generator=gen, dtype=torch.int32)
    routing = fp8quant.moe_routing(ids, e, expert_offset=e // 2, max_m=t * k)
    x = torch.randn(t, 384, device="cuda", generator=gen).to(torch.bfloat16)
    ok = True
    for kind, max_m in (("contiguous", None), ("masked", t * k)):
        q, s = zeroed(fp8quant.moe_dispatch_quant(x, routing, layout=kind, max_m=max_m, scale_layout=layout))
        fp8quant.moe_dispatch_quant(x, routing, layout=kind, max_m=max_m, scale_layout=layout, out=(q, s))
        rq, rs = fp8quant.reference.moe_dispatch_quant(x, routing, layout=kind, max_m=max_m, scale_layout=layout)
        ok &= torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    return bool(ok)


def check_dispatch_nvfp4(t: int, k: int, e: int, scale_layout: str, gen) -> bool:
    """Dispatch into NVFP4 with per-expert encode scales, both MoE layouts, dropped slots."""
    ids = torch.randint(-1, 2 * e, (t, k), device="cuda", generator=gen, dtype=torch.int32)
    routing = fp8quant.moe_routing(ids, e, expert_offset=e // 2, max_m=t * k)
    x = torch.randn(t, 208, device="cuda", generator=gen).to(torch.bfloat16)  # 13 groups of 16
    g = torch.rand(e, device="cuda", generator=gen) * 100 + 1
    ok = True
    for kind, max_m in (("contiguous", None), ("masked", t * k)):
        kw = dict(layout=kind, max_m=max_m, scale_layout=scale_layout)
        q, s = zeroed(fp8quant.moe_dispatch_nvfp4(x, routing, g, **kw))
        fp8quant.moe_dispatch_nvfp4(x, routing, g, **kw, out=(q, s))
        rq, rs = fp8quant.reference.moe_dispatch_nvfp4(x, routing, g, **kw)
        ok &= torch.equal(q, rq) and torch.equal(s.view(torch.uint8), rs.view(torch.uint8))
    return bool(ok)


def check_norm(m: int, h: int, layout: str, residual: bool, gen) -> bool:
    """rms_norm_quant and rms_norm against their references, the residual updated in place."""
    x = torch.randn(m, h, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(h, device="cuda", generator=gen).to(torch.bfloat16)
    res0 = torch.randn(m, h, device="cuda", generator=gen).to(torch.bfloat16) if residual else None
    res = None if res0 is None else res0.clone()
    got = fp8quant.rms_norm_quant(x, w, residual=res, scale_layout=layout)
    want = fp8quant.reference.rms_norm_quant(x, w, residual=res0, scale_layout=layout)
    ok = torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and all(
        torch.equal(a, b) for a, b in zip(got[1:], want[1:])
    )
    y = fp8quant.rms_norm(x, w)
    return ok and torch.equal(y, fp8quant.reference.rms_norm(x, w))


def check_transforms(shape, gen) -> bool:
    """Every scale transform between layouts, packing and unpacking, and the SM100 weight form."""
    ok = True
    e = torch.randint(-127, 128, shape, device="cuda", generator=gen, dtype=torch.int32)
    values = torch.where(e == -127, 0x00400000, (e + 127) << 23).view(torch.float32)  # exact powers of two
    for src in ("row", "mn", "mn_tma"):
        spec = fp8quant.scale_spec(src, shape[-2], shape[-1], tuple(shape[:-2]))
        scale = torch.zeros(spec.numel, device="cuda").as_strided(spec.shape, spec.stride).copy_(values)
        for dst in ("row", "mn", "mn_tma"):
            ok &= torch.equal(fp8quant.convert_scales(scale, src, dst), values)
        packed = fp8quant.pack_ue8m0(scale, src)
        ok &= torch.equal(packed, fp8quant.reference.pack_ue8m0(scale, src))
        ok &= torch.equal(fp8quant.unpack_ue8m0(packed, shape[-1], src), values)
    n = shape[-2] * 100
    ok &= torch.equal(fp8quant.sm100_weight_scales(values.contiguous(), n, 100),
                      fp8quant.reference.sm100_weight_scales(values.contiguous(), n, 100))  # fmt: skip
    return bool(ok)


if __name__ == "__main__":
    sys.exit(main())
