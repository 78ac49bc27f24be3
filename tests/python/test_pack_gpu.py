"""GPU tests of the scale transforms (fp8quant.convert_scales, pack_ue8m0, unpack_ue8m0,
sm100_weight_scales) and of fp8quant.requantize_ue8m0: each kernel bit-identical to its reference
through the shared harness (poisoned out= buffers with guards, whole buffers compared, padding
rows and bytes included), over M or N in {1, 3, 4, 5, 127, 129, 4097}, odd and even G, batches,
invalid values, streams, CUDA graphs and torch.compile. Marked ``gpu``."""

from __future__ import annotations

import pytest
import torch
from gpu_harness import check_graph, check_op, check_side_stream, pdl_setting

import fp8quant
from fp8quant import pack, reference
from fp8quant.weights import _requantize as REQUANT

pytestmark = pytest.mark.gpu

FP32_LAYOUTS = ("row", "mn", "mn_tma")
ROWS = (1, 3, 4, 5, 127, 129, 4097)
GROUPS = (1, 3, 4, 7, 56)
NO_INVALID = torch.tensor([-1])


def in_layout(values: torch.Tensor, layout: str) -> torch.Tensor:
    """fp32 ``[*, M, G]`` values placed in a new whole buffer of ``layout`` (padding rows poisoned
    with NaN: a transform must not read them)."""
    spec = fp8quant.scale_spec(layout, values.shape[-2], values.shape[-1], tuple(values.shape[:-2]))
    buf = torch.full((spec.numel,), float("nan"), device=values.device)
    return buf.as_strided(spec.shape, spec.stride).copy_(values)


def random_scales(shape, gen) -> torch.Tensor:
    """Positive fp32 scales of many magnitudes, never a power of two by construction only."""
    return torch.rand(shape, generator=gen, device="cuda") * 2.0 ** torch.randint(
        -60, 60, shape, generator=gen, device="cuda"
    )


def pow2_scales(shape, gen) -> torch.Tensor:
    """Powers of two over UE8M0's whole range, 2^-127 (byte 0, a subnormal) and 2^127 included,
    built from their bits (CUDA's exp2 is not exact for subnormal results)."""
    e = torch.randint(-127, 128, shape, generator=gen, device="cuda", dtype=torch.int32)
    flat = e.view(-1)
    flat[0] = -127
    flat[-1] = 127
    return torch.where(e == -127, 0x00400000, (e + 127) << 23).view(torch.float32)


def flagged(ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ref, NO_INVALID.to(ref.device)


# --- convert_scales ------------------------------------------------------------------------------


@pytest.mark.parametrize("dst", FP32_LAYOUTS)
@pytest.mark.parametrize("src", FP32_LAYOUTS)
@pytest.mark.parametrize("m", ROWS)
def test_convert(m, src, dst, gen):
    for g in (3, 56) if m != 4097 else (7,):
        scale = in_layout(random_scales((m, g), gen), src)
        ref = reference.convert_scales(scale, src, dst)
        check_op(
            lambda out=None: pack._convert(scale, src, dst, out=out), (ref,), pack._convert.buffers(scale, src, dst)
        )
        assert torch.equal(fp8quant.convert_scales(scale, src, dst), ref)


@pytest.mark.parametrize("src,dst", [("row", "mn_tma"), ("mn_tma", "row"), ("mn", "mn_tma")])
def test_convert_batched(src, dst, gen):
    scale = in_layout(random_scales((3, 129, 5), gen), src)
    ref = reference.convert_scales(scale, src, dst)
    check_op(lambda out=None: pack._convert(scale, src, dst, out=out), (ref,), pack._convert.buffers(scale, src, dst))


# --- pack_ue8m0 / unpack_ue8m0 ------------------------------------------------------------------


@pytest.mark.parametrize("src", FP32_LAYOUTS)
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("m", ROWS)
def test_pack(m, g, src, gen):
    scale = in_layout(pow2_scales((m, g), gen), src)
    ref = reference.pack_ue8m0(scale, src)
    check_op(lambda out=None: pack._pack(scale, src, out=out), flagged(ref), pack._pack.buffers(scale, src))
    assert torch.equal(fp8quant.pack_ue8m0(scale, src), ref)


@pytest.mark.parametrize("dst", FP32_LAYOUTS)
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("m", ROWS)
def test_unpack(m, g, dst, gen):
    packed = reference.pack_ue8m0(in_layout(pow2_scales((m, g), gen), "row"), "row")
    ref = reference.unpack_ue8m0(packed, g, dst)
    check_op(lambda out=None: pack._unpack(packed, g, dst, out=out), flagged(ref), pack._unpack.buffers(packed, g, dst))
    assert torch.equal(fp8quant.unpack_ue8m0(packed, g, dst), ref)


def test_pack_unpack_batched(gen):
    scale = in_layout(pow2_scales((4, 130, 7), gen), "mn_tma")
    ref = reference.pack_ue8m0(scale, "mn_tma")
    check_op(lambda out=None: pack._pack(scale, "mn_tma", out=out), flagged(ref), pack._pack.buffers(scale, "mn_tma"))
    back = reference.unpack_ue8m0(ref, 7, "row")
    check_op(lambda out=None: pack._unpack(ref, 7, "row", out=out), flagged(back), pack._unpack.buffers(ref, 7, "row"))
    assert torch.equal(back, scale)


def test_packs_what_the_quantizer_packs(gen):
    """The quantizer's UE8M0 fp32 scales, packed, are the bytes its packed_ue8m0 layout holds."""
    x = torch.randn(133, 7 * 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    _, fp32 = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma", ue8m0=True)
    _, packed = fp8quant.per_token_group_quant(x, 128, scale_layout="packed_ue8m0")
    got = fp8quant.pack_ue8m0(fp32, "mn_tma")
    spec = fp8quant.scale_spec("packed_ue8m0", 133, 7)
    assert torch.equal(got.as_strided((spec.numel,), (1,)), packed.as_strided((spec.numel,), (1,)))


@pytest.mark.parametrize("bad", [3.0, 0.0, -2.0, float("inf"), float("nan"), 2.0**-128, 1.5 * 2.0**-127])
def test_pack_refuses_what_is_not_a_power_of_two(bad, gen):
    scale = in_layout(pow2_scales((9, 6), gen), "row")
    scale[7, 5] = bad
    scale[8, 0] = 3.0  # a later one: the first is named
    with pytest.raises(ValueError) as kernel_error:
        fp8quant.pack_ue8m0(scale, "row")
    with pytest.raises(ValueError) as reference_error:
        reference.pack_ue8m0(scale, "row")
    assert str(kernel_error.value) == str(reference_error.value)
    assert str(kernel_error.value).startswith("scale[7, 5] = ")
    packed = fp8quant.pack_ue8m0(scale, "row", validate=False)  # the bad byte is UE8M0's NaN
    assert (int(packed[7, 1]) >> 8) & 0xFF == 0xFF


def test_unpack_refuses_the_nan_byte(gen):
    packed = reference.pack_ue8m0(in_layout(pow2_scales((6, 5), gen), "row"), "row")
    packed[4, 1] |= 0xFF  # group 4 of row 4
    with pytest.raises(ValueError, match=r"^packed holds the UE8M0 NaN byte 0xFF for group \[4, 4\]$"):
        fp8quant.unpack_ue8m0(packed, 5)
    with pytest.raises(ValueError, match=r"^packed holds the UE8M0 NaN byte 0xFF for group \[4, 4\]$"):
        reference.unpack_ue8m0(packed, 5)
    assert torch.isnan(fp8quant.unpack_ue8m0(packed, 5, validate=False)[4, 4])


# --- sm100_weight_scales -------------------------------------------------------------------------


@pytest.mark.parametrize("kb", [1, 3, 4, 56, 57])
@pytest.mark.parametrize("n", [1, 3, 127, 128, 129, 4097, 7168])
def test_sm100_weight_scales(n, kb, gen):
    w_scale = pow2_scales((-(-n // 128), kb), gen)
    ref = reference.sm100_weight_scales(w_scale, n)
    check_op(lambda out=None: pack._sm100(w_scale, n, 128, out=out), flagged(ref), pack._sm100.buffers(w_scale, n, 128))


def test_sm100_weight_scales_experts_and_errors(gen):
    w_scale = pow2_scales((5, 3, 7), gen)  # 5 experts, N = 300
    ref = reference.sm100_weight_scales(w_scale, 300)
    check_op(
        lambda out=None: pack._sm100(w_scale, 300, 128, out=out), flagged(ref), pack._sm100.buffers(w_scale, 300, 128)
    )
    w_scale[2, 1, 6] = 0.75
    with pytest.raises(ValueError, match=r"^w_scale\[2, 1, 6\] = 0.75 is not a power of two"):
        fp8quant.sm100_weight_scales(w_scale, 300)


def test_weight_path_end_to_end(gen):
    """per_block_quant(ue8m0=True) then sm100_weight_scales, as DeepGEMM SM100 reads a weight."""
    w = torch.randn(1000, 640, generator=gen, device="cuda", dtype=torch.bfloat16)
    _, s = fp8quant.per_block_quant(w, ue8m0=True)
    assert torch.equal(fp8quant.sm100_weight_scales(s, 1000), reference.sm100_weight_scales(s.cpu(), 1000).cuda())


# --- requantize_ue8m0 ----------------------------------------------------------------------------


def checkpoint(shape, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp8 weight with fp32 block scales as DeepSeek-V3 checkpoints hold them (scales not powers of two)."""
    w = torch.randn(shape, generator=gen, device="cuda") * 10.0 ** torch.randint(
        -3, 3, (), generator=gen, device="cuda"
    )
    return fp8quant.per_block_quant(w.to(torch.bfloat16))


def check_requantize(w, w_scale, out_kwargs=None):
    refs = reference.requantize_ue8m0(w, w_scale)
    check_op(
        lambda out=None: fp8quant.requantize_ue8m0(w, w_scale, out=out), refs,
        REQUANT.buffers(w, w_scale, 128, 128, 1e-4), x=None, out_kwargs=out_kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("k", [1, 3, 128, 200, 4097, 7168])
@pytest.mark.parametrize("n", [1, 3, 129, 4097])
def test_requantize_shapes(n, k, gen):
    check_requantize(*checkpoint((n, k), gen))


def test_requantize_experts_strided_unaligned(gen):
    check_requantize(*checkpoint((3, 260, 520), gen))
    w, s = checkpoint((200, 389), gen)  # rows not on 16-byte boundaries: the byte path
    check_requantize(w, s)
    wide = torch.zeros(200, 400, dtype=torch.float8_e4m3fn, device="cuda")
    wide[:, 3:392].copy_(w)
    check_requantize(wide[:, 3:392], s)  # misaligned pointer
    check_requantize(*checkpoint((256, 384), gen), out_kwargs={"row_pad": 3})


def test_requantize_keeps_power_of_two_blocks(gen):
    """A weight whose scales are already powers of two comes back unchanged."""
    w, s = fp8quant.per_block_quant(torch.randn(300, 500, generator=gen, device="cuda"), ue8m0=True)
    q2, s2 = fp8quant.requantize_ue8m0(w, s)
    assert torch.equal(q2.view(torch.uint8), w.view(torch.uint8)) and torch.equal(s2, s)


# --- streams, graphs, compile ----------------------------------------------------------------------


def test_side_stream(gen):
    scale = in_layout(pow2_scales((300, 7), gen), "mn_tma")
    ref = reference.pack_ue8m0(scale, "mn_tma")
    check_side_stream(
        lambda out=None: pack._pack(scale, "mn_tma", out=out), flagged(ref), pack._pack.buffers(scale, "mn_tma")
    )
    w, s = checkpoint((300, 400), gen)
    check_side_stream(
        lambda out=None: fp8quant.requantize_ue8m0(w, s, out=out), reference.requantize_ue8m0(w, s),
        REQUANT.buffers(w, s, 128, 128, 1e-4),
    )  # fmt: skip
    packed = reference.pack_ue8m0(in_layout(pow2_scales((300, 7), gen), "row"), "row")
    check_side_stream(lambda out=None: pack._unpack(packed, 7, "mn_tma", out=out),
                      flagged(reference.unpack_ue8m0(packed, 7, "mn_tma")), pack._unpack.buffers(packed, 7, "mn_tma"))  # fmt: skip
    fp32 = in_layout(random_scales((300, 7), gen), "row")
    check_side_stream(lambda out=None: pack._convert(fp32, "row", "mn_tma", out=out),
                      (reference.convert_scales(fp32, "row", "mn_tma"),), pack._convert.buffers(fp32, "row", "mn_tma"))  # fmt: skip
    w_scale = pow2_scales((3, 5), gen)
    check_side_stream(lambda out=None: pack._sm100(w_scale, 300, 128, out=out),
                      flagged(reference.sm100_weight_scales(w_scale, 300)), pack._sm100.buffers(w_scale, 300, 128))  # fmt: skip


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl_on", "pdl_off"])
@pytest.mark.parametrize("variant", ["out", "allocating"])
def test_cuda_graph(variant, pdl, gen):
    scale = in_layout(pow2_scales((130, 7), gen), "row")
    w, s = checkpoint((300, 400), gen)
    with pdl_setting(pdl):
        check_graph(
            lambda out=None: pack._pack(scale, "row", out=out),
            lambda: scale.copy_(pow2_scales((130, 7), gen)),
            lambda: flagged(reference.pack_ue8m0(scale, "row")),
            pack._pack.buffers(scale, "row"),
            variant=variant,
        )
        check_graph(
            lambda out=None: fp8quant.requantize_ue8m0(w, s, out=out),
            lambda: [t.copy_(n) for t, n in zip((w, s), checkpoint((300, 400), gen))],
            lambda: reference.requantize_ue8m0(w, s),
            REQUANT.buffers(w, s, 128, 128, 1e-4),
            variant=variant,
        )


def test_public_calls_capture_without_sync(gen):
    """The validating wrappers skip their device read while a graph is captured."""
    scale = in_layout(pow2_scales((64, 8), gen), "mn_tma")
    fp8quant.pack_ue8m0(scale)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        packed = fp8quant.pack_ue8m0(scale)
        back = fp8quant.unpack_ue8m0(packed, 8)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(back, scale)


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_torch_compile(dynamic, gen):
    torch._dynamo.reset()

    def prepare(w, s):
        q2, s2 = fp8quant.requantize_ue8m0(w, s)
        return q2, fp8quant.sm100_weight_scales(s2, w.shape[0]), fp8quant.convert_scales(s2, "row", "mn")

    fn = torch.compile(prepare, fullgraph=True, dynamic=dynamic)
    for n in (130, 300):
        w, s = checkpoint((n, 260), gen)
        q2, packed, s_mn = fn(w, s)
        rq, rs = reference.requantize_ue8m0(w, s)
        assert torch.equal(q2.view(torch.uint8), rq.view(torch.uint8))
        assert torch.equal(packed, reference.sm100_weight_scales(rs, n))
        assert torch.equal(s_mn, rs)
    torch._dynamo.reset()


def test_c_api_errors_reach_python(gen):
    w, s = checkpoint((256, 256), gen)
    with pytest.raises(ValueError, match=r"^block_n: must be 128, got 64$"):
        fp8quant.requantize_ue8m0(w, torch.empty(4, 2, device="cuda"), (64, 128))
    with pytest.raises(ValueError, match=r"^scale: overlaps w_scale$|^q: overlaps"):
        fp8quant.requantize_ue8m0(w, s, out=(torch.empty_like(w), s))
