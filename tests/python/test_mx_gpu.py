"""GPU tests of ``fp8quant.mxfp8_quant`` and ``fp8quant.nvfp4_quant``: the CUDA kernel must be
bit-identical to ``fp8quant.reference`` (docs/contract.md, "MXFP8", "NVFP4") on random data (never zeros),
with out= buffers poisoned and guarded (every byte of the swizzled buffer's padding must be
written, as 0), over the edge shapes (M in 1, 3, 4, 5, 127, 129, 4097, 70000; odd and even group
counts), 3-D input, every dtype, both recipes and layouts, unaligned rows, special values, a
non-default stream, CUDA-graph capture with PDL on and off, and behind a PDL producer that
writes the input late. Marked ``gpu``.

NVFP4 the same way (encode scales per tensor, per expert, and large enough to saturate the
group scales). Rows of at least 64 groups (K >= 1024) in launches past one wave of the GPU's
threads go in chunks of 64 groups a warp, 2 a lane; the chunk tests take M just past that
(chunked_m) at every edge of the chunk grid: one chunk (K = 1024) and two (K = 2048), a chunk of
one group (K = 1040: 65 groups, 68 swizzled slots; K = 2064), half a chunk (K = 1536), whole
chunks at DeepSeek's K = 7168, padding slots inside a chunk (K = 1008 swizzled: 63 groups, 64
slots), specials spread over a chunk's lanes and groups."""

from __future__ import annotations

import pytest
import torch
from gpu_harness import check_graph, check_op, check_pdl_producer, check_side_stream, pdl_setting

import fp8quant
from fp8quant import reference
from fp8quant.gemm import calc_diff
from fp8quant.mx import _fp4 as FP4
from fp8quant.mx import _quant as MX

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LAYOUTS = ("swizzled", "row")


def make_input(shape, dtype, seed: int) -> torch.Tensor:
    """Gaussian rows whose groups span many magnitudes (so scale bytes vary), a few specials."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=gen)
    spread = torch.exp2(
        torch.randint(-20, 20, (*shape[:-1], -(-shape[-1] // 16), 1), device="cuda", generator=gen).float()
    )
    x = x * spread.repeat_interleave(16, -1).flatten(-2)[..., : shape[-1]]  # a magnitude per 16 elements
    return x.to(dtype)


def check(x, recipe, layout):
    refs = reference.mxfp8_quant(x, recipe=recipe, scale_layout=layout)
    buffers = MX.buffers(x, recipe, layout)
    check_op(lambda out=None: fp8quant.mxfp8_quant(x, recipe=recipe, scale_layout=layout, out=out), refs, buffers,
             x=x)  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("recipe", fp8quant.MX_RECIPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 4, 5, 127, 129, 4097])
@pytest.mark.parametrize("k", [32, 96, 128, 7168])
def test_bit_exact(m, k, dtype, recipe, layout):
    check(make_input((m, k), dtype, m * k), recipe, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_large_m(layout):
    check(make_input((70000, 256), torch.bfloat16, 1), "rceil", layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(3, 5, 96), (8, 129, 256), (1, 1, 32)])
def test_batched(shape, layout):
    check(make_input(shape, torch.bfloat16, 2), "rceil", layout)


@pytest.mark.parametrize("recipe", fp8quant.MX_RECIPES)
def test_special_values(recipe):
    """NaN, ±inf, signed zeros, subnormals, all-zero groups, amax at 448 * 2^k and one ulp above,
    the largest finite values."""
    x = make_input((64, 256), torch.float32, 3)
    x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40])
    x[1, :32] = 0.0
    x[2, 0] = 448.0 * 1024
    x[3, 0] = torch.tensor(448.0 * 1024).view(torch.int32).add(1).view(torch.float32)
    x[4, :32] = torch.finfo(torch.float32).max
    x[5, :32] = 1e-42
    check(x, recipe, "swizzled")
    check(x.to(torch.bfloat16), recipe, "row")


def test_unaligned_rows():
    """Rows whose stride is not a multiple of 16 bytes take the element-wise path."""
    base = make_input((33, 136), torch.bfloat16, 4)
    x = base[:, 8:104]  # row stride 136 elements, start 16 bytes in: aligned
    check(x, "rceil", "swizzled")
    x = base[:, 1:97]  # start 2 bytes in: unaligned
    check(x, "floor", "row")


def test_side_stream_and_graph():
    x = make_input((129, 256), torch.bfloat16, 5)
    buffers = MX.buffers(x, "rceil", "swizzled")

    def call(out=None):
        return fp8quant.mxfp8_quant(x, out=out)

    check_side_stream(call, reference.mxfp8_quant(x), buffers, x=x)
    gen = torch.Generator(device="cuda").manual_seed(6)
    for pdl in (True, False):
        with pdl_setting(pdl):
            for variant in ("out", "allocate"):
                check_graph(call, lambda: x.copy_(torch.randn(x.shape, device="cuda", generator=gen).to(x.dtype)),
                            lambda: reference.mxfp8_quant(x), buffers, variant=variant)  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pdl_producer(layout):
    """Behind a producer that lets the kernel launch at once and writes x late, the kernel reads
    the final x and writes nothing before the producer is done (gpu_harness.check_pdl_producer)."""
    x, stale = make_input((1024, 7168), torch.bfloat16, 15), make_input((1024, 7168), torch.bfloat16, 16)

    def call(out=None):
        return fp8quant.mxfp8_quant(x, scale_layout=layout, out=out)

    check_pdl_producer(call, [x], [stale], reference.mxfp8_quant(x, scale_layout=layout),
                       MX.buffers(x, "rceil", layout))  # fmt: skip


def test_dequant_consumer():
    """dequant(quant(x)) @ w against x @ w in bf16 (the consumer check available on the H200)."""
    x = make_input((256, 1024), torch.bfloat16, 7)
    w = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
    q, s = fp8quant.mxfp8_quant(x)
    y = fp8quant.mxfp8_dequant(q, s).to(torch.bfloat16) @ w.T
    ref = x @ w.T
    assert calc_diff(y.float(), ref.float()) < 2e-3


# --- NVFP4 ----------------------------------------------------------------------------------------


def chunked_m(k: int, layout: str, batch: int = 1, past: int = 1) -> int:
    """M whose launch of nvfp4_quant takes chunks (src/kernels/block_scaled_quant.cuh,
    nvfp4_chunks: more group slots, padding included, than the GPU holds threads, 2048 an SM),
    `past` rows into the first 128-row block of such M."""
    groups = k // 16
    slots = groups if layout == "row" else -(-groups // 4) * 4
    threads = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count * 2048
    rows = threads // (slots * batch) + 1
    return -(-rows // 128) * 128 + past


def check_fp4(x, layout, global_scale=None):
    g = fp8quant.nvfp4_global_scale(x) if global_scale is None else global_scale
    refs = reference.nvfp4_quant(x, g, scale_layout=layout)[:2]
    buffers = FP4.buffers(x, g, layout)
    check_op(lambda out=None: fp8quant.nvfp4_quant(x, g, scale_layout=layout, out=out)[:2], refs, buffers, x=x)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 4, 5, 127, 129, 4097])
@pytest.mark.parametrize("k", [16, 48, 128, 2064, 7168])
def test_nvfp4_bit_exact(m, k, dtype, layout):
    check_fp4(make_input((m, k), dtype, m + k), layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("past", [0, 1, 3, 127])
@pytest.mark.parametrize("k", [1008, 1024, 1040, 1536, 2048, 2064, 7168])
def test_nvfp4_chunks(k, past, dtype, layout):
    m = chunked_m(k, layout, past=past)
    check_fp4(make_input((m, k), dtype, m + k), layout)


def test_nvfp4_large_m_and_experts():
    check_fp4(make_input((70000, 256), torch.bfloat16, 8), "swizzled")
    check_fp4(make_input((70000, 2048), torch.bfloat16, 15), "row")
    for k in (256, 2064):
        for m in (129, chunked_m(k, "swizzled", batch=8, past=3)):
            x = make_input((8, m, k), torch.bfloat16, 9 + k + m)
            check_fp4(x, "swizzled", fp8quant.nvfp4_global_scale(x, per_batch=True))
            check_fp4(x, "row", torch.tensor(3.0, device="cuda"))


@pytest.mark.parametrize("m", [64, 0])
@pytest.mark.parametrize("k", [256, 4096])
def test_nvfp4_special_values(k, m):
    """Specials in every place of a word, and (K = 4096, M past chunked_m: chunks) spread over a
    chunk's lanes and groups."""
    m = m or chunked_m(k, "swizzled", past=64)
    x = make_input((m, k), torch.float32, 10)
    x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40])
    x[1, :16] = 0.0
    x[2, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * 1e-3
    x[3, 16:32] = -0.0
    x[4, 32:48] = torch.tensor([float("inf")] + [0.0] * 7 + [-float("inf")] + [-1e-3] * 7)
    x[5, 48:64] = torch.finfo(torch.float32).max
    gen = torch.Generator(device="cuda").manual_seed(16)
    for row in range(6, 64):  # a NaN, an infinity or a -0 in a random place of each row's groups
        cols = torch.randint(0, k, (k // 64,), device="cuda", generator=gen)
        x[row, cols] = torch.tensor([float("nan"), -float("inf"), -0.0, float("inf")], device="cuda")[row % 4]
    x[64:] = x[:64].repeat(-(-m // 64) - 1, 1)[: m - 64]
    check_fp4(x, "swizzled")
    check_fp4(x.to(torch.bfloat16), "row", torch.tensor(1e30, device="cuda"))  # scales saturate at 448
    check_fp4(x.to(torch.float16), "swizzled", torch.tensor(1e-30, device="cuda"))  # every group scale 0
    for g in (0.01, 1e36):  # the factor S / s by IEEE division: S below 1/4, above 2^116
        check_fp4(x.to(torch.bfloat16), "swizzled", torch.tensor(g, device="cuda"))


def test_nvfp4_unaligned_side_stream_and_graph():
    base = make_input((33, 2200), torch.bfloat16, 11)
    check_fp4(base[:, 1:97], "row")
    check_fp4(base[:, 1:2065], "row")
    rows = chunked_m(2064, "row", past=5)
    base = make_input((rows, 2200), torch.bfloat16, 11)
    check_fp4(base[:, 1:2065], "row")  # chunks, element by element
    check_fp4(base[:, 8:2056], "swizzled")  # a view 16 bytes in: chunks, vectorized
    check_fp4(make_input((rows, 2100), torch.float32, 19)[:, 3:2051], "swizzled")  # float32, 12 bytes in
    x = make_input((chunked_m(2048, "swizzled", past=1), 2048), torch.bfloat16, 12)
    g = fp8quant.nvfp4_global_scale(x)
    buffers = FP4.buffers(x, g, "swizzled")

    def call(out=None):
        return fp8quant.nvfp4_quant(x, g, out=out)[:2]

    check_side_stream(call, reference.nvfp4_quant(x, g)[:2], buffers, x=x)
    gen = torch.Generator(device="cuda").manual_seed(13)
    for pdl in (True, False):
        with pdl_setting(pdl):
            for variant in ("out", "allocate"):
                check_graph(call, lambda: x.copy_(torch.randn(x.shape, device="cuda", generator=gen).to(x.dtype)),
                            lambda: reference.nvfp4_quant(x, g)[:2], buffers, variant=variant)  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nvfp4_pdl_producer(layout):
    """The producer writes x and the encode scale late: the kernel reads both after its wait."""
    x, stale = make_input((1024, 7168), torch.bfloat16, 17), make_input((1024, 7168), torch.bfloat16, 18)
    g = fp8quant.nvfp4_global_scale(x)
    stale_g = fp8quant.nvfp4_global_scale(stale) * 0.5

    def call(out=None):
        return fp8quant.nvfp4_quant(x, g, scale_layout=layout, out=out)[:2]

    check_pdl_producer(call, [x, g], [stale, stale_g], reference.nvfp4_quant(x, g, scale_layout=layout)[:2],
                       FP4.buffers(x, g, layout))  # fmt: skip


def test_nvfp4_dequant_consumer():
    x = make_input((256, 1024), torch.bfloat16, 14)
    w = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
    y = fp8quant.nvfp4_dequant(*fp8quant.nvfp4_quant(x)).to(torch.bfloat16) @ w.T
    assert calc_diff(y.float(), (x @ w.T).float()) < 2e-2
