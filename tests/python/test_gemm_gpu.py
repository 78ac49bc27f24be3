"""GPU tests of fp8quant.gemm: quantize_activation and prepare_weight fed to torch._scaled_mm
directly and through fp8quant.linear (backend "scaled_mm" and "auto"), against a bf16 matmul
(calc_diff < 1e-3) on DeepSeek-V3's six weight shapes and M in {1, 3, 5, 127, 4096}; a weight
from a checkpoint-style (fp8, scale) pair; K whose block count is not a multiple of 4 (padded
weight scales); torch.compile(fullgraph=True) and CUDA graphs; mismatches refused. DeepGEMM
(2.6.1, installed on the H200 from shared/wheels; skipped where it does not import): linear with
the deep_gemm recipe bitwise equal to calling fp8_gemm_nt directly, "auto" choosing it, float32
output refused before DeepGEMM asserts, its signature the CPU stand-in's. Marked ``gpu`` (the
scaled_mm recipe needs SM90)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from test_gemm import DEEP_GEMM_2_6_1_FP8_GEMM_NT

import fp8quant
from fp8quant import gemm
from fp8quant.gemm import FormatMismatchError, QuantizedActivation, calc_diff
from fp8quant.recipes import ActivationFormat, recipe

pytestmark = pytest.mark.gpu

SHAPES = ((4096, 7168), (7168, 18432), (18432, 7168), (24576, 1536), (32768, 512), (7168, 16384))
MS = (1, 3, 5, 127, 4096)
BOUND = 1e-3  # calc_diff against the bf16 product (DeepGEMM's and vLLM's tests use the same)


@pytest.fixture(autouse=True)
def needs_sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("torch._scaled_mm takes 1 x 128 / 128 x 128 scales on SM90 only")


def randn(shape, gen, scale: float = 1.0) -> torch.Tensor:
    """Normal bf16 values (never zeros: every group and block has a real amax)."""
    return (torch.randn(shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)


def bf16_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def pad_rows(xq: QuantizedActivation) -> tuple[torch.Tensor, torch.Tensor]:
    """q and mn_tma scales with M padded to a multiple of 4, as a caller of torch._scaled_mm must
    (SPEC.md section 4): zero rows, scales of strides exactly (1, Mp)."""
    m, k = xq.q.shape
    mp = -(-m // 4) * 4
    q = torch.zeros((mp, k), dtype=torch.float8_e4m3fn, device="cuda")
    q[:m] = xq.q
    s = torch.zeros((k // 128, mp), device="cuda").t()
    s[:m] = xq.scale
    return q, s


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_scaled_mm_directly(n, k, m, gen):
    """The formats the scaled_mm recipe names are what torch._scaled_mm takes."""
    x, w = randn((m, k), gen), randn((n, k), gen, 0.05)
    xq = fp8quant.quantize_activation(x, "scaled_mm")
    wq = fp8quant.prepare_weight(w, "scaled_mm")
    assert xq.scale.stride() == (1, -(-m // 4) * 4) and wq.scale.is_contiguous()  # kb % 4 == 0 here
    a_q, a_s = pad_rows(xq)
    y = torch._scaled_mm(a_q, wq.q.t(), a_s, wq.scale.t(), out_dtype=torch.bfloat16)[:m]
    assert calc_diff(y, bf16_product(x, w)) < BOUND


@pytest.mark.parametrize("backend", ["scaled_mm", "auto"])
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_linear(n, k, m, backend, gen):
    x, w = randn((m, k), gen), randn((n, k), gen, 0.05)
    wq = fp8quant.prepare_weight(w, backend)
    assert wq.recipe is (recipe("scaled_mm", 9) if backend == "scaled_mm" else fp8quant.select_backend(n, k))
    want = bf16_product(x, w)
    y = fp8quant.linear(x, wq)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert calc_diff(y, want) < BOUND
    if wq.recipe.backend == "scaled_mm":
        y_pre = fp8quant.linear(fp8quant.quantize_activation(x, wq.recipe), wq)  # pre-quantized: padded copies
        assert torch.equal(y_pre, y)


def test_linear_leading_dims_and_out_dtype(gen):
    x, w = randn((2, 3, 7168), gen), randn((4096, 7168), gen, 0.05)
    wq = fp8quant.prepare_weight(w, "scaled_mm")
    y = fp8quant.linear(x, wq, out_dtype=torch.float32)
    assert y.shape == (2, 3, 4096) and y.dtype == torch.float32
    assert calc_diff(y, bf16_product(x, w)) < BOUND
    assert torch.equal(fp8quant.linear(x.reshape(6, 7168), wq, out_dtype=torch.float32), y.reshape(6, 4096))
    assert fp8quant.linear(x[:, :0], wq).shape == (2, 0, 4096)


@pytest.mark.parametrize("m", [1, 5, 128])
def test_checkpoint_pair(m, gen):
    """A DeepSeek-V3 checkpoint's (fp8 weight, weight_scale_inv), used as it is."""
    n, k = 7168, 18432
    x, w = randn((m, k), gen), randn((n, k), gen, 0.05)
    w_q, w_s = fp8quant.per_block_quant(w)  # as the checkpoint would hold them
    wq = fp8quant.prepare_weight((w_q, w_s), "scaled_mm")
    assert torch.equal(wq.q.view(torch.uint8), w_q.view(torch.uint8)) and torch.equal(wq.scale, w_s)
    assert calc_diff(fp8quant.linear(x, wq), bf16_product(x, w)) < BOUND
    on_cpu = fp8quant.prepare_weight((w_q.cpu(), w_s.cpu()), "scaled_mm", device="cuda")  # loaded on the CPU
    assert on_cpu.q.is_cuda and torch.equal(fp8quant.linear(x, on_cpu), fp8quant.linear(x, wq))


@pytest.mark.parametrize("m", [1, 5, 128])
@pytest.mark.parametrize("n, k", [(256, 640), (4096, 384), (128, 640), (2048, 1152)])
def test_block_count_not_a_multiple_of_4(n, k, m, gen):
    """kb = ceil(K / 128) % 4 != 0: torch._scaled_mm refuses the padded weight scales and
    misreads unpadded ones (docs/backends.md), so linear hands F.scaled_mm the padded buffer."""
    x, w = randn((m, k), gen), randn((n, k), gen, 0.05)
    wq = fp8quant.prepare_weight(w, "scaled_mm")
    kb = k // 128
    assert wq.scale.shape == (-(-n // 128), kb) and wq.scale.stride() == (-(-kb // 4) * 4, 1)
    assert calc_diff(fp8quant.linear(x, wq), bf16_product(x, w)) < BOUND
    xq = fp8quant.quantize_activation(x, "scaled_mm")
    assert calc_diff(fp8quant.linear(xq, wq), bf16_product(x, w)) < BOUND


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile(dynamic, gen):
    torch._dynamo.reset()
    n, k = 4096, 7168
    w = randn((n, k), gen, 0.05)
    wq = fp8quant.prepare_weight(w, "scaled_mm")
    fn = torch.compile(lambda x: fp8quant.linear(x * 2, wq), fullgraph=True, dynamic=dynamic)
    for m in (3, 128, 5, 64):  # M % 4 != 0 takes the traced padding route
        x = randn((m, k), gen)
        y = fn(x)
        eager = fp8quant.linear(x * 2, wq)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        torch.testing.assert_close(y, eager)  # element by element, within bf16's rounding
        assert calc_diff(y, bf16_product(x * 2, w)) < BOUND
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_padded_weight_scales(dynamic, gen):
    """kb % 4 != 0: F.scaled_mm behind fp8quant's opaque op (Dynamo cannot trace its builtin)."""
    torch._dynamo.reset()
    w = randn((256, 640), gen, 0.05)
    wq = fp8quant.prepare_weight(w, "scaled_mm")
    fn = torch.compile(lambda x: fp8quant.linear(x, wq), fullgraph=True, dynamic=dynamic)
    for m in (5, 128):
        x = randn((m, 640), gen)
        torch.testing.assert_close(fn(x), fp8quant.linear(x, wq))  # element by element, within bf16's rounding
        assert calc_diff(fn(x), bf16_product(x, w)) < BOUND
    torch._dynamo.reset()


@pytest.mark.parametrize("m", [3, 128])
def test_cuda_graph(m, gen):
    """Captured once, replayed with new values copied into the static input."""
    n, k = 4096, 7168
    w = randn((n, k), gen, 0.05)
    wq = fp8quant.prepare_weight(w, "scaled_mm")
    x = randn((m, k), gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch recommends
        fp8quant.linear(x, wq)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fp8quant.linear(x, wq)
    for _ in range(2):
        new = randn((m, k), gen)
        x.copy_(new)
        y.fill_(float("nan"))  # an element the replay leaves unwritten fails below
        graph.replay()
        torch.cuda.synchronize()
        # Element by element, within bf16's rounding (the graph's GEMM may accumulate in another order)
        torch.testing.assert_close(y, fp8quant.linear(new, wq))
        assert calc_diff(y, bf16_product(new, w)) < BOUND


def test_mismatches_refused(gen):
    x, w = randn((4, 7168), gen), randn((4096, 7168), gen, 0.05)
    wq = fp8quant.prepare_weight(w, "scaled_mm")
    row = fp8quant.quantize_activation(x, "triton")
    with pytest.raises(FormatMismatchError, match=r"^activation format 'row' does not match 'scaled_mm sm90'"):
        fp8quant.linear(row, wq)
    q, s = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma", ue8m0=True)
    ue8m0 = QuantizedActivation(q, s, ActivationFormat("mn_tma", True))
    with pytest.raises(FormatMismatchError, match=r"^activation format 'mn_tma\+ue8m0' does not match 'scaled_mm"):
        fp8quant.linear(ue8m0, wq)
    with pytest.raises(FormatMismatchError, match=r"^backend='deep_gemm' .* does not match the weight, prepared for"):
        fp8quant.linear(x, wq, "deep_gemm")
    with pytest.raises(ValueError, match=r"^fp8quant.linear does not run 'cutlass sm90'"):
        fp8quant.linear(x, fp8quant.prepare_weight(w, "cutlass"))
    with pytest.raises(ValueError, match=r"^x is on cpu, the weight on cuda:0: both must be on one device$"):
        fp8quant.linear(x.cpu(), wq)


@pytest.mark.parametrize("m", [1, 5, 128, 4096])
@pytest.mark.parametrize("n, k", [(4096, 7168), (24576, 1536)])
def test_deep_gemm(n, k, m, gen):
    """DeepGEMM itself: linear on the deep_gemm recipe (x quantized inside, or pre-quantized) writes
    bitwise what deep_gemm.fp8_gemm_nt writes when called directly with the same operands."""
    deep_gemm = pytest.importorskip("deep_gemm")
    x, w = randn((m, k), gen), randn((n, k), gen, 0.05)
    wq = fp8quant.prepare_weight(w, "deep_gemm")
    assert wq.recipe is recipe("deep_gemm", 9)
    xq = fp8quant.quantize_activation(x, wq.recipe)
    d = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    deep_gemm.fp8_gemm_nt((xq.q, xq.scale), (wq.q, wq.scale), d)
    assert torch.equal(fp8quant.linear(xq, wq), d)
    assert torch.equal(fp8quant.linear(x, wq, "deep_gemm"), d)
    assert calc_diff(d, bf16_product(x, w)) < BOUND


def test_deep_gemm_auto_and_out_dtype(gen):
    """backend="auto" takes DeepGEMM once it imports (no warning); float32 output is refused by linear,
    where DeepGEMM's SM90 kernel would assert."""
    deep_gemm = pytest.importorskip("deep_gemm")
    gemm._import_deep_gemm.cache_clear()
    gemm._have_deep_gemm.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gemm.select_backend(4096, 7168) is recipe("deep_gemm", 9)
    x, w = randn((4, 7168), gen), randn((4096, 7168), gen, 0.05)
    wq = fp8quant.prepare_weight(w)
    assert wq.recipe is recipe("deep_gemm", 9)
    with pytest.raises(ValueError, match=r"^out_dtype torch.float32: SM90's DeepGEMM .* writes bfloat16 only"):
        fp8quant.linear(x, wq, out_dtype=torch.float32)
    xq = fp8quant.quantize_activation(x, wq.recipe)
    d = torch.empty((4, 4096), dtype=torch.float32, device="cuda")
    with pytest.raises(RuntimeError, match=r"d.scalar_type\(\) == torch::kBFloat16"):
        deep_gemm.fp8_gemm_nt((xq.q, xq.scale), (wq.q, wq.scale), d)


def test_deep_gemm_signature():
    """DeepGEMM 2.6.1's fp8_gemm_nt takes the parameters of the CPU tests' stand-in, in order."""
    deep_gemm = pytest.importorskip("deep_gemm")
    if deep_gemm.__version__ != "2.6.1":
        pytest.skip(f"the stand-in follows DeepGEMM 2.6.1, this is {deep_gemm.__version__}")
    first = deep_gemm.fp8_gemm_nt.__doc__.strip().splitlines()[0]  # pybind11: "name(a: ..., b: ...) -> None"
    names = re.findall(r"[(,] ?(\w+): ", first)
    assert tuple(names) == tuple(name for name, _ in DEEP_GEMM_2_6_1_FP8_GEMM_NT), first
