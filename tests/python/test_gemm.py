"""fp8quant.recipes and fp8quant.gemm on the CPU: the recipe table, quantize_activation and
prepare_weight against the reference quantizers (bit-exact, whole buffers), the scaled_mm weight
scales' padding, format mismatches refused by name, linear's reference path against a float64
product, the operands linear hands torch._scaled_mm and DeepGEMM (through stand-ins: torch 2.11's
checks as measured on an H200, and DeepGEMM 2.6.1's signature and host-side assertions; neither
library runs here, the GPU suite runs both), float32 output refused for DeepGEMM on SM90,
backend="auto" deciding on a real import of deep_gemm, torch.compile, and calc_diff."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import inspect
import sys
import types
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from handmath import full_buffer

import fp8quant
from fp8quant import gemm, reference
from fp8quant.__main__ import build_parser
from fp8quant.gemm import FormatMismatchError, QuantizedActivation, QuantizedWeight, calc_diff
from fp8quant.recipes import RECIPES, ActivationFormat, Recipe, WeightFormat, describe_recipes, recipe

FP8 = torch.float8_e4m3fn
DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends.md"
PAIRS = [(r.backend, r.arch) for r in RECIPES]
N, K = 192, 640  # a partial last block row (nb = 2) and kb = 5, not a multiple of 4
MS = (1, 3, 5, 127, 128)


def randn(*shape, seed=0, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int32)


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same dtype, shape, strides and bits; a strided (scale) tensor's over its whole buffer,
    padding included."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.stride() == expected.stride() or actual.numel() <= 1
    if actual.is_contiguous():
        assert torch.equal(bits(actual), bits(expected))
    else:
        assert torch.equal(bits(full_buffer(actual)), bits(full_buffer(expected)))


def unpack_words(words: torch.Tensor, groups: int) -> torch.Tensor:
    """float32 2^(e-127) of packed UE8M0 words [R, P] (byte j of word p is group 4p + j), written
    out independently of fp8quant: [R, groups]."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    e = torch.stack([(w >> (8 * j)) & 0xFF for j in range(4)], -1).flatten(-2)[:, :groups]
    return torch.pow(2.0, (e - 127).double()).float()


def dequant_activation(q: torch.Tensor, s: torch.Tensor, fmt: ActivationFormat) -> torch.Tensor:
    g = q.shape[1] // 128
    s = unpack_words(s, g) if fmt.scale_layout == "packed_ue8m0" else s
    return (q.double().unflatten(1, (g, 128)) * s.double().unsqueeze(-1)).flatten(1)


def dequant_weight(q: torch.Tensor, s: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    n, k = q.shape
    kb = -(-k // 128)
    rows = unpack_words(s, kb) if fmt.scales == "sm100_packed" else s.repeat_interleave(128, 0)[:n]
    return q.double() * rows.double().repeat_interleave(128, 1)[:, :k]


def expected_product(x: torch.Tensor, w: torch.Tensor, r: Recipe) -> torch.Tensor:
    """float64 product of x and w quantized by the reference in r's formats."""
    a = r.activation
    q, s = reference.per_token_group_quant(x, 128, scale_layout=a.scale_layout, ue8m0=a.ue8m0)
    wq, ws = reference.per_block_quant(w, ue8m0=r.weight.ue8m0)
    if r.weight.scales == "sm100_packed":
        ws = reference.sm100_weight_scales(ws, w.shape[0])
    return dequant_activation(q, s, a) @ dequant_weight(wq, ws, r.weight).t()


# --- the recipe table ----------------------------------------------------------------------------


def test_recipe_table():
    assert len(set(PAIRS)) == len(PAIRS)
    for r in RECIPES:
        assert isinstance(r.activation, ActivationFormat) and isinstance(r.weight, WeightFormat)
        assert recipe(r.backend, r.arch) is r
        assert r.runner == (r.backend in ("deep_gemm", "scaled_mm", "reference"))
        assert r.activation.ue8m0 == r.weight.ue8m0, r.name  # one UE8M0 flag per GEMM
        assert r.activation.group_size == 128 and r.weight.block == (128, 128)
        assert r.source
    sm100 = recipe("deep_gemm", 10)
    assert (sm100.activation.scale_layout, sm100.weight.scales) == ("packed_ue8m0", "sm100_packed")
    assert recipe("deep_gemm", 9).activation == ActivationFormat("mn_tma", False)
    assert recipe("scaled_mm", 9).weight.scale_cols_align == 4 and recipe("scaled_mm", 9).m_align == 4
    assert (recipe("deep_gemm", 9).n_align, recipe("deep_gemm", 9).k_align) == (64, 128)
    assert recipe("triton", 10).activation.scale_layout == "row"
    assert recipe("cutlass", 9).activation.scale_layout == "mn"
    assert recipe("reference", 12) is recipe("reference", 0)
    for name in ("ActivationFormat", "Recipe", "RECIPES", "WeightFormat", "linear", "prepare_weight", "recipe"):
        assert name in fp8quant.__all__


@pytest.mark.parametrize(
    "backend, arch", [("scaled_mm", 10), ("deep_gemm", 8), ("cublas", 9), ("auto", 9)]
)  # fmt: skip
def test_unknown_recipe(backend, arch):
    with pytest.raises(ValueError, match=r"^no recipe for backend=.*; valid \(backend, arch\) pairs: \('deep_gemm', 9\), "
                                         r"\('deep_gemm', 10\), \('scaled_mm', 9\).*and \('reference', any\)$"):  # fmt: skip
        recipe(backend, arch)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: ActivationFormat("col", False), ValueError, r"^scale_layout must be one of"),
        (lambda: ActivationFormat("packed_ue8m0", False), ValueError, r"^ue8m0=False contradicts scale_layout='packed_ue8m0'"),
        (lambda: ActivationFormat("row", 1), TypeError, r"^ue8m0 must be a bool"),
        (lambda: ActivationFormat("row", False, 96), ValueError, r"^group_size must be one of \(32, 64, 128\)"),
        (lambda: WeightFormat("tiles", False), ValueError, r"^scales must be one of \('block', 'sm100_packed'\)"),
        (lambda: WeightFormat("sm100_packed", False), ValueError, r"^ue8m0=False contradicts scales='sm100_packed'"),
        (lambda: WeightFormat("block", False, 0), ValueError, r"^scale_cols_align must be a positive int, got 0"),
        (lambda: WeightFormat("block", False, block=(1, 128)), ValueError, r"^block must be \(128, 128\)"),
        (lambda: Recipe("cublas", 9, ActivationFormat("row", False), WeightFormat("block", False)), ValueError, r"^backend must be one of"),
        (lambda: Recipe("triton", 9, ActivationFormat("row", False), WeightFormat("block", False), m_align=0), ValueError, r"^m_align must be a positive int"),
    ],
)  # fmt: skip
def test_format_validation(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_format_names():
    assert [ActivationFormat(*f).name for f in (("mn_tma", False), ("mn_tma", True), ("packed_ue8m0", True))] == [
        "mn_tma", "mn_tma+ue8m0", "packed_ue8m0",
    ]  # fmt: skip
    assert ActivationFormat("row", False, 64).name == "row/64"
    assert [r.weight.name for r in (recipe("deep_gemm", 9), recipe("scaled_mm", 9), recipe("deep_gemm", 10))] == [
        "block", "block/kb4", "sm100_packed",
    ]  # fmt: skip
    assert recipe("scaled_mm", 9).name == "scaled_mm sm90" and recipe("reference", 9).name == "reference"


def test_docs_hold_the_table():
    """docs/backends.md carries describe_recipes()'s table as it is now."""
    table = describe_recipes()
    assert len(table.splitlines()) == 2 + len(RECIPES)
    assert table in DOCS.read_text(encoding="utf-8")


# --- choosing a backend --------------------------------------------------------------------------


#: deep_gemm.fp8_gemm_nt's parameters and defaults in DeepGEMM 2.6.1 (an alias of fp8_fp4_gemm_nt,
#: whose stub is in the wheel's deep_gemm/_C.pyi)
DEEP_GEMM_2_6_1_FP8_GEMM_NT = (
    ("a", inspect.Parameter.empty), ("b", inspect.Parameter.empty), ("d", inspect.Parameter.empty), ("c", None),
    ("recipe", None), ("recipe_a", None), ("recipe_b", None), ("compiled_dims", "nk"), ("disable_ue8m0_cast", False),
)  # fmt: skip
DEEP_GEMM_WHEEL = "deep_gemm-2.6.1-cp312-cp312-linux_x86_64.whl"


def dg_assert(ok: bool, condition: str) -> None:
    """DeepGEMM's DG_HOST_ASSERT: a RuntimeError quoting the C++ condition of DeepGEMM 2.6.1."""
    if not ok:
        raise RuntimeError(f"Assertion error (deep_gemm 2.6.1 stand-in): {condition}")


def deep_gemm_stand_in() -> types.ModuleType:
    """A stand-in ``deep_gemm`` module for the device arch ``fake.arch`` (9 or 10): its
    ``fp8_gemm_nt`` has DeepGEMM 2.6.1's signature and refuses what 2.6.1's host code asserts
    (``csrc/apis/gemm.hpp``, ``csrc/apis/layout.hpp``, ``csrc/utils/layout.hpp``, the SM90 1D2D
    kernel's ``not c and d bf16``), with the same condition texts; then it computes with the
    float64 dequantized operands. ``fake.sf_copies`` counts activation scales DeepGEMM would have
    copied into the MN-major TMA-aligned layout (accepted, but not what fp8quant hands it)."""
    fake = types.ModuleType("deep_gemm")
    fake.arch, fake.calls, fake.sf_copies = 9, [], 0

    def ceil_div(a: int, b: int) -> int:
        return -(-a // b)

    def major_check(t: torch.Tensor) -> None:
        dg_assert(t.dim() in (2, 3), "dim == 2 or dim == 3")
        dg_assert(t.stride(-2) == 1 or t.stride(-1) == 1, "t.stride(-2) == 1 or t.stride(-1) == 1")

    def check_sf_layout(sf, mn, k, gran_mn, gran_k, tma_stride_check=False, sm90_sfb_check=False, type_check=None):
        if type_check is not None:
            dg_assert(sf.dtype == type_check, "sf.scalar_type() == type_check.value()")
        dg_assert(sf.dtype in (torch.float32, torch.int32), "sf_dtype == torch::kFloat or sf_dtype == torch::kInt")
        dg_assert(sf.dim() == 2, "sf.dim() == static_cast<int>(num_groups.has_value()) + 2")
        dg_assert(sf.shape[-2] == ceil_div(mn, gran_mn), "sf.size(-2) == ceil_div(mn, gran_mn)")
        dg_assert(sf.shape[-1] == ceil_div(k, gran_k * (1 if sf.dtype == torch.float32 else 4)),
                  "sf.size(-1) == ceil_div(k, gran_k * (sf_dtype == torch::kFloat ? 1 : 4))")  # fmt: skip
        if tma_stride_check:
            dg_assert(sf.stride(-2) == 1 or mn == 1, "sf.stride(-2) == 1 or mn == 1")
            dg_assert(sf.stride(-1) == fp8quant.layouts.align(mn, 16 // sf.element_size()),
                      "sf.stride(-1) == get_tma_aligned_size(mn, sf.element_size())")  # fmt: skip
        if sm90_sfb_check:
            rows, cols = sf.shape[-2:]
            ok = (sf.stride(-1) == 1 and sf.stride(-2) == cols) or (sf.stride(-1) == rows and sf.stride(-2) == 1)
            dg_assert(ok, "(sf.stride(-1) == 1 and sf.stride(-2) == sf.size(-1)) or "
                          "(sf.stride(-1) == sf.size(-2) and sf.stride(-2) == 1)")  # fmt: skip
        return sf

    def transform_sf(sf, mn, k, gran_mn, gran_k, disable_ue8m0_cast):
        """transform_sf_into_required_layout: the scales' values as the kernel reads them, and the
        dtype DeepGEMM holds them in afterwards."""
        check_sf_layout(sf, mn, k, gran_mn, gran_k)
        sm90_form = fake.arch == 9 or disable_ue8m0_cast
        if sf.dtype == torch.float32 and (gran_mn, gran_k) == (1, 128) and sm90_form:
            aligned = sf.stride(-2) == 1 and sf.stride(-1) == fp8quant.layouts.align(mn, 4)
            fake.sf_copies += not aligned  # get_mn_major_tma_aligned_tensor copies other layouts
            return sf, torch.float32
        if sf.dtype == torch.float32 and (gran_mn, gran_k) == (128, 128) and sm90_form:
            return check_sf_layout(sf, mn, k, gran_mn, gran_k, False, True, torch.float32), torch.float32
        if sf.dtype == torch.float32 and gran_k in (32, 128) and fake.arch == 10:
            dg_assert(not disable_ue8m0_cast, "not disable_ue8m0_cast")
            return (sf.view(torch.int32) & 0x7F800000).view(torch.float32), torch.int32  # packs the exponents
        if sf.dtype == torch.int32 and gran_mn == 1 and gran_k in (32, 128) and fake.arch == 10:
            return check_sf_layout(sf, mn, k, gran_mn, gran_k, True, False, torch.int32), torch.int32
        dg_assert(False, "Unknown SF transformation")

    def scales(sf, mn, k, gran_mn, gran_k):
        """float64 [mn, k]: each element's scale."""
        s = unpack_words(sf, ceil_div(k, gran_k)) if sf.dtype == torch.int32 else sf
        return s.double().repeat_interleave(gran_mn, 0)[:mn].repeat_interleave(gran_k, 1)[:, :k]

    def fp8_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                    disable_ue8m0_cast=False):  # fmt: skip
        (a_q, sfa), (b_q, sfb) = a, b
        major_check(a_q)
        major_check(b_q)
        k_major = a_q.stride(-1) == 1 and b_q.stride(-1) == 1
        if fake.arch == 9:  # fp8_requires_k_major
            dg_assert(k_major, "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K")
        major_check(d)
        dg_assert(d.stride(-1) == 1, "t.stride(-1) == 1")  # check_major_type_cd
        for t in (a_q, b_q):
            dg_assert(t.dtype == FP8, "ab.scalar_type() == kPackedFP4 and arch_major == 10")
        (m, k), (n, k_), (m_, n_) = a_q.shape, b_q.shape, d.shape
        dg_assert(m == m_ and n == n_ and k == k_, "m == m_ and n == n_ and k == k_")
        dg_assert(d.dtype in (torch.bfloat16, torch.float32),
                  "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat")  # fmt: skip
        if m == 0 or n == 0:  # early_return
            return
        if c is not None:
            dg_assert(c.dtype == d.dtype, "d.scalar_type() == c.value().scalar_type()")
        if recipe is None and recipe_a is None:  # get_default_recipe
            if fake.arch == 9:
                dg_assert(sfa.dtype == torch.float32 and sfb.dtype == torch.float32,
                          "sfa_dtype == torch::kFloat and sfb_dtype == torch::kFloat")  # fmt: skip
                recipe = (1, 128, 128)
            else:
                dg_assert(sfb.dtype in (torch.float32, torch.int32),
                          "sfb_dtype == torch::kFloat or sfb_dtype == torch::kInt")  # fmt: skip
                recipe = (1, 128, 128) if sfb.dtype == torch.float32 else (1, 1, 128)
        dg_assert((recipe_a is None) == (recipe_b is None), "recipe_a.has_value() == recipe_b.has_value()")
        dg_assert((recipe_a is not None) != (recipe is not None), "recipe_a.has_value() != recipe.has_value()")
        gran_a = (recipe[0], recipe[2]) if recipe is not None else tuple(recipe_a)
        gran_b = (recipe[1], recipe[2]) if recipe is not None else tuple(recipe_b)
        sfa, sfa_kind = transform_sf(sfa, m, k, *gran_a, disable_ue8m0_cast)
        sfb, _ = transform_sf(sfb, n, k, *gran_b, disable_ue8m0_cast)
        if fake.arch == 9 and sfa_kind == torch.float32:
            if gran_b[0] == 1:  # sm90_fp8_gemm_1d1d
                dg_assert(c is not None and d.dtype == torch.float32,
                          "c.has_value() and d.scalar_type() == torch::kFloat")  # fmt: skip
            else:  # sm90_fp8_gemm_1d2d
                dg_assert(c is None and d.dtype == torch.bfloat16,
                          "not c.has_value() and d.scalar_type() == torch::kBFloat16")  # fmt: skip
        else:
            dg_assert(fake.arch == 10 and sfa_kind == torch.int32, "Unsupported architecture or scaling factor types")
        fake.calls.append((m, n, k))
        y = (a_q.double() * scales(sfa, m, k, *gran_a)) @ (b_q.double() * scales(sfb, n, k, *gran_b)).t()
        d.copy_(y if c is None else y + c.double())

    fake.fp8_gemm_nt = fp8_gemm_nt
    return fake


@pytest.fixture(autouse=True)
def fresh_deep_gemm_import():
    """gemm decides ``import deep_gemm`` once per process: every test here starts (and leaves)
    with the decision undone, so that its own sys.modules entry counts."""
    gemm._import_deep_gemm.cache_clear()
    gemm._have_deep_gemm.cache_clear()
    yield
    gemm._import_deep_gemm.cache_clear()
    gemm._have_deep_gemm.cache_clear()


@pytest.fixture
def fake_deep_gemm(monkeypatch):
    """:func:`deep_gemm_stand_in` as ``deep_gemm``; the test sets its arch."""
    fake = deep_gemm_stand_in()
    monkeypatch.setitem(sys.modules, "deep_gemm", fake)
    return fake


def test_select_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # not importable, whatever is installed
    assert fp8quant.select_backend(4096, 7168, "cpu") is recipe("reference", 0)
    assert fp8quant.select_backend(4096, 7168, "cpu", arch=9) is recipe("scaled_mm", 9)
    assert fp8quant.select_backend(4100, 7168, "cpu", arch=9) is recipe("reference", 0)  # N % 16
    assert fp8quant.select_backend(4096, 7168, "cpu", arch=10) is recipe("reference", 0)
    with pytest.raises(ValueError, match=r"^n must be a positive int, got 0$"):
        fp8quant.select_backend(0, 7168, "cpu")
    with pytest.raises(TypeError, match=r"^arch must be an int"):
        fp8quant.select_backend(128, 128, "cpu", arch="9")


def test_select_backend_with_deep_gemm(fake_deep_gemm):
    for arch in (9, 10):
        assert fp8quant.select_backend(4096, 7168, "cpu", arch=arch) is recipe("deep_gemm", arch)
    assert fp8quant.select_backend(4160, 7168, "cpu", arch=9) is recipe("deep_gemm", 9)
    assert fp8quant.select_backend(4112, 7168, "cpu", arch=9) is recipe("scaled_mm", 9)  # N % 64 != 0
    assert fp8quant.select_backend(4112, 7168, "cpu", arch=10) is recipe("reference", 0)
    w = fp8quant.prepare_weight(randn(N, K), arch=9)
    assert w.recipe is recipe("deep_gemm", 9)


# --- quantize_activation and prepare_weight ------------------------------------------------------


@pytest.mark.parametrize("backend, arch", PAIRS)
def test_quantize_activation(backend, arch):
    x = randn(5, K, seed=1)
    r = recipe(backend, arch)
    got = fp8quant.quantize_activation(x, backend, arch=arch)
    assert isinstance(got, QuantizedActivation) and got.format is r.activation
    want = reference.per_token_group_quant(x, 128, scale_layout=r.activation.scale_layout, ue8m0=r.activation.ue8m0)
    assert_same(got.q, want[0])
    assert_same(got.scale, want[1])
    again = fp8quant.quantize_activation(x, r)  # a Recipe, e.g. weight.recipe
    assert again.format is r.activation and torch.equal(bits(full_buffer(again.scale)), bits(full_buffer(want[1])))


def test_quantize_activation_defaults(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    x = randn(3, 256)
    assert fp8quant.quantize_activation(x).format is recipe("reference", 0).activation  # auto on the CPU
    assert fp8quant.quantize_activation(x, arch=9).format.scale_layout == "mn_tma"  # auto for SM90: scaled_mm
    assert fp8quant.quantize_activation(x, "deep_gemm").format.scale_layout == "mn_tma"  # CPU: arch 9
    assert fp8quant.quantize_activation(randn(2, 3, 256), "deep_gemm", arch=10).scale.shape == (2, 3, 1)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: fp8quant.quantize_activation([1.0]), TypeError, r"^x must be a torch.Tensor, got list"),
        (lambda: fp8quant.quantize_activation(randn(256)), ValueError, r"^x must be 2-D \[M, K\] or 3-D"),
        (lambda: fp8quant.quantize_activation(randn(2, 200), "reference"), ValueError, r"^x.shape\[-1\] \(K=200\) must be a positive multiple"),
        (lambda: fp8quant.quantize_activation(randn(2, 256), 9), TypeError, r"^backend must be a backend name, 'auto' or a Recipe, got int"),
        (lambda: fp8quant.quantize_activation(randn(2, 256), "scaled_mm", arch="9"), TypeError, r"^arch must be an int"),
        (lambda: fp8quant.quantize_activation(randn(2, 256), recipe("scaled_mm", 9), arch=10), ValueError, r"^arch=10 contradicts backend='scaled_mm sm90'"),
    ],
)  # fmt: skip
def test_quantize_activation_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def expected_weight(w_q: torch.Tensor, w_s: torch.Tensor, r: Recipe) -> tuple[torch.Tensor, torch.Tensor]:
    """What prepare_weight should give for fp8 blocks (w_q, w_s), from the references."""
    fmt = r.weight
    if fmt.ue8m0:
        w_q, w_s = reference.requantize_ue8m0(w_q, w_s)
    if fmt.scales == "sm100_packed":
        return w_q, reference.sm100_weight_scales(w_s, w_q.shape[0])
    return w_q, w_s


def check_prepared(got: QuantizedWeight, want_q: torch.Tensor, want_s: torch.Tensor, r: Recipe) -> None:
    assert isinstance(got, QuantizedWeight) and got.recipe is r and got.format is r.weight
    assert got.q.is_contiguous()
    assert_same(got.q, want_q)
    if r.weight.scale_cols_align == 1:
        assert_same(got.scale, want_s)
    else:
        assert torch.equal(got.scale, want_s)  # values; the padded buffer is test_scaled_mm_scale_padding's


@pytest.mark.parametrize("backend, arch", PAIRS)
def test_prepare_weight_from_bf16(backend, arch):
    w = randn(N, K, seed=2)
    r = recipe(backend, arch)
    want_q, want_s = reference.per_block_quant(w, ue8m0=r.weight.ue8m0)
    if r.weight.scales == "sm100_packed":
        want_s = reference.sm100_weight_scales(want_s, N)
    check_prepared(fp8quant.prepare_weight(w, backend, arch=arch), want_q, want_s, r)


@pytest.mark.parametrize("backend, arch", PAIRS)
def test_prepare_weight_from_checkpoint_pair(backend, arch):
    """(fp8 weight, weight_scale_inv) as a DeepSeek-V3 checkpoint holds them: used as they are for
    fp32 recipes, re-quantized with power-of-two scales for DeepGEMM on SM100."""
    w_q, w_s = reference.per_block_quant(randn(N, K, seed=3))
    r = recipe(backend, arch)
    got = fp8quant.prepare_weight((w_q, w_s), backend, arch=arch)
    check_prepared(got, *expected_weight(w_q, w_s, r), r)
    if not r.weight.ue8m0:
        assert got.q.data_ptr() == w_q.data_ptr()  # the checkpoint's fp8 bytes, not a copy


@pytest.mark.parametrize("k, cols", [(640, 8), (512, 4), (128, 4), (1152, 12)])
def test_scaled_mm_scale_padding(k, cols):
    """scaled_mm's weight scales: the [nb, kb] view of a zero-padded [nb, align(kb, 4)] buffer."""
    w = randn(N, k, seed=4)
    got = fp8quant.prepare_weight(w, "scaled_mm", arch=9)
    kb = k // 128
    assert got.scale.shape == (2, kb) and got.scale.stride() == (cols, 1) and got.scale.storage_offset() == 0
    whole = got.scale.as_strided((2, cols), (cols, 1))
    assert got.scale.untyped_storage().nbytes() == 2 * cols * 4
    assert torch.equal(whole[:, :kb], reference.per_block_quant(w)[1]) and not whole[:, kb:].any()


@pytest.mark.parametrize(
    "weight, kwargs, error, message",
    [
        (randn(N, 200), {"backend": "scaled_mm"}, ValueError, r"^weight K=200 must be a multiple of 128: activations are quantized in groups of 128"),
        (randn(200, K), {"backend": "deep_gemm"}, ValueError, r"^backend 'deep_gemm sm90' needs N % 64 == 0 and K % 128 == 0, got weight \[N=200, K=640\]$"),
        (randn(2, N, K), {}, ValueError, r"^weight must be 2-D \[N, K\], got shape \(2, 192, 640\)$"),
        (randn(N, K).to(torch.int8), {}, TypeError, r"^weight must be bfloat16, float16 or float32 \(or a \(w_fp8, scale\) pair\), got torch.int8$"),
        ("w", {}, TypeError, r"^weight must be a tensor or a \(w_fp8, weight_scale_inv\) pair, got str$"),
        ((randn(N, K),), {}, TypeError, r"^weight must be a tensor or a \(w_fp8, weight_scale_inv\) pair, got 1 items$"),
        ((randn(N, K), torch.ones(2, 5)), {}, TypeError, r"^weight\[0\] must be a float8_e4m3fn tensor \[N, K\]$"),
        ((randn(N, K).to(FP8), torch.ones(2, 4)), {}, ValueError, r"^weight\[1\] \(weight_scale_inv\) must be float32 of shape \(2, 5\) for weight\[0\] \[192, 640\], got torch.float32 \(2, 4\)$"),
        ((randn(N, K).to(FP8), torch.ones(2, 5, dtype=torch.float64)), {}, ValueError, r"^weight\[1\] \(weight_scale_inv\) must be float32"),
        (randn(N, K), {"backend": "nope"}, ValueError, r"^no recipe for backend='nope' on arch=9"),
    ],
)  # fmt: skip
def test_prepare_weight_errors(weight, kwargs, error, message):
    with pytest.raises(error, match=message):
        fp8quant.prepare_weight(weight, **kwargs)


# --- linear: mismatches --------------------------------------------------------------------------


def test_activation_of_another_format_is_refused():
    x = randn(4, K, seed=5)
    w = fp8quant.prepare_weight(randn(N, K), "scaled_mm", arch=9)
    row = fp8quant.quantize_activation(x, "triton", arch=9)
    with pytest.raises(FormatMismatchError, match=r"^activation format 'row' does not match 'scaled_mm sm90', which reads "
                                                  r"activations as 'mn_tma': quantize with quantize_activation\(x, weight.recipe\)$"):  # fmt: skip
        fp8quant.linear(row, w)
    packed = fp8quant.quantize_activation(x, "deep_gemm", arch=10)
    w9 = fp8quant.prepare_weight(randn(N, K), "deep_gemm", arch=9)
    with pytest.raises(FormatMismatchError, match=r"^activation format 'packed_ue8m0' does not match 'deep_gemm sm90'"):
        fp8quant.linear(packed, w9)
    assert issubclass(FormatMismatchError, ValueError)


def test_ue8m0_flag_mismatch_is_refused():
    """SPEC.md section 5: UE8M0 scales where the GEMM reads fp32 ones (same layout) gave 0%
    accuracy in engines; here the format travels with the tensor and linear refuses it."""
    x = randn(4, K, seed=6)
    q, s = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma", ue8m0=True)
    ue8m0 = QuantizedActivation(q, s, ActivationFormat("mn_tma", ue8m0=True))
    for backend in ("scaled_mm", "deep_gemm"):
        w = fp8quant.prepare_weight(randn(N, K), backend, arch=9)
        with pytest.raises(FormatMismatchError, match=rf"^activation format 'mn_tma\+ue8m0' does not match '{backend} sm90', "
                                                      r"which reads activations as 'mn_tma'"):  # fmt: skip
            fp8quant.linear(ue8m0, w)
    w = fp8quant.prepare_weight(randn(N, K), "scaled_mm", arch=9)
    relabeled = QuantizedWeight(w.q, w.scale, WeightFormat("block", ue8m0=True, scale_cols_align=4), w.recipe)
    with pytest.raises(FormatMismatchError, match=r"^weight.format 'block\+ue8m0/kb4' differs from its recipe "
                                                  r"'scaled_mm sm90''s weights \(block/kb4\)$"):  # fmt: skip
        fp8quant.linear(x, relabeled)


def test_weight_of_another_backend_is_refused():
    x = randn(4, K, seed=7)
    w = fp8quant.prepare_weight(randn(N, K), "scaled_mm", arch=9)
    with pytest.raises(FormatMismatchError, match=r"^backend='deep_gemm' \(activations mn_tma, weights block\) does not match the "
                                                  r"weight, prepared for 'scaled_mm sm90' \(activations mn_tma, weights block/kb4\): "
                                                  r"prepare it for 'deep_gemm', or pass backend='auto'$"):  # fmt: skip
        fp8quant.linear(x, w, "deep_gemm")
    with pytest.raises(
        FormatMismatchError, match=r"^backend 'deep_gemm sm100' \(weights sm100_packed\) does not match"
    ):
        fp8quant.linear(x, w, recipe("deep_gemm", 10))
    assert fp8quant.linear(x, w, "scaled_mm").shape == (4, N)  # its own backend named: fine
    assert fp8quant.linear(x, w, recipe("scaled_mm", 9)).shape == (4, N)


def test_backend_is_checked_before_the_weight():
    """With a prepared weight, backend is checked first: a non-name (3) was accepted silently and an
    unknown name met FormatMismatchError (as if it were another backend's) instead of its own error."""
    x = randn(4, K, seed=7)
    w = fp8quant.prepare_weight(randn(N, K), "scaled_mm", arch=9)
    with pytest.raises(TypeError, match=r"^backend must be a backend name, 'auto' or a Recipe, got int$"):
        fp8quant.linear(x, w, 3)
    with pytest.raises(ValueError, match=r"^unknown backend 'bogus': backend must be 'auto', one of \('deep_gemm', "
                                         r"'cutlass', 'scaled_mm', 'triton', 'reference'\) or a Recipe$"):  # fmt: skip
        fp8quant.linear(x, w, "bogus")
    with pytest.raises(TypeError, match=r"^backend must be a backend name, 'auto' or a Recipe, got NoneType$"):
        fp8quant.linear(x, randn(N, K), None)  # the unprepared weight's path says the same
    assert fp8quant.linear(x, w, "auto").shape == (4, N)


def test_formats_only_recipes_are_refused():
    x = randn(4, K)
    for backend in ("cutlass", "triton"):
        w = fp8quant.prepare_weight(randn(N, K), backend, arch=9)
        with pytest.raises(ValueError, match=rf"^fp8quant.linear does not run '{backend} sm90' \(its recipe gives formats only\): "
                                             r"call that engine's kernel with quantize_activation"):  # fmt: skip
            fp8quant.linear(x, w)


@pytest.mark.parametrize(
    "x, make_w, kwargs, error, message",
    [
        (randn(4, 512), None, {}, ValueError, r"^x must be \[\.\.\., K\] with K = 640 \(the weight's\), got shape \(4, 512\)$"),
        (randn(4, K).to(torch.int32), None, {}, TypeError, r"^x must be bfloat16, float16 or float32 \(or a QuantizedActivation\), got torch.int32$"),
        ([1.0], None, {}, TypeError, r"^x must be a torch.Tensor or a QuantizedActivation, got list$"),
        (randn(4, K), None, {"out_dtype": torch.int8}, ValueError, r"^out_dtype torch.int8 is not one 'scaled_mm sm90' writes$"),
        (randn(4, K), lambda w: w._replace(scale=w.scale.contiguous()), {}, FormatMismatchError,
         r"^weight.scale must have shape \(2, 5\) and strides \(8, 1\) for format 'block/kb4', got \(2, 5\) and \(5, 1\)$"),
        (randn(4, K), lambda w: w._replace(recipe="scaled_mm"), {}, TypeError, r"^weight.recipe must be a Recipe"),
        (fp8quant.quantize_activation(randn(4, K), "scaled_mm", arch=9)._replace(scale=torch.ones(4, 5)), None, {}, FormatMismatchError,
         r"^x.scale must have shape \(4, 5\) and strides \(1, 4\) for format 'mn_tma', got \(4, 5\) and \(5, 1\)$"),
    ],
)  # fmt: skip
def test_linear_errors(x, make_w, kwargs, error, message):
    w = fp8quant.prepare_weight(randn(N, K), "scaled_mm", arch=9)
    with pytest.raises(error, match=message):
        fp8quant.linear(x, make_w(w) if make_w else w, **kwargs)


# --- linear: results -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend, arch", [("reference", 0), ("scaled_mm", 9)])
@pytest.mark.parametrize("m", MS)
def test_linear_reference_path(backend, arch, m):
    """On the CPU the scaled_mm recipe runs the reference too: float32 product of the dequantized
    operands, against float64."""
    x, w = randn(m, K, seed=m), randn(N, K, seed=100 + m)
    r = recipe(backend, arch)
    prepared = fp8quant.prepare_weight(w, backend, arch=arch)
    want = expected_product(x, w, r)
    tol = 1e-5 * want.abs().max().item()
    for inp in (x, fp8quant.quantize_activation(x, r)):
        got = fp8quant.linear(inp, prepared, out_dtype=torch.float32)
        assert got.shape == (m, N) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=tol)
    y = fp8quant.linear(x, prepared)
    assert y.dtype == torch.bfloat16 and calc_diff(y, want) < 1e-5


def test_linear_leading_dims_and_plain_weights():
    x, w = randn(2, 3, K, seed=8), randn(N, K, seed=9)
    y = fp8quant.linear(x, w, out_dtype=torch.float32)  # prepared on the fly: auto on the CPU, the reference
    assert y.shape == (2, 3, N)
    want = expected_product(x.reshape(6, K), w, recipe("reference", 0)).reshape(2, 3, N)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    w_q, w_s = reference.per_block_quant(w)
    prepared = fp8quant.prepare_weight(w, "scaled_mm")
    assert torch.equal(fp8quant.linear(x, (w_q, w_s), "scaled_mm"), fp8quant.linear(x, prepared))
    assert fp8quant.linear(randn(0, K), w).shape == (0, N) and fp8quant.linear(randn(2, 0, K), w).shape == (2, 0, N)
    assert fp8quant.linear(randn(K), w).shape == (N,)


@pytest.mark.parametrize("arch", [9, 10])
@pytest.mark.parametrize("m", MS)
def test_linear_through_deep_gemm(fake_deep_gemm, arch, m):
    """The operands linear hands deep_gemm.fp8_gemm_nt pass DeepGEMM 2.6.1's checks (the stand-in
    makes them), with no scale copied, and give the reference's product: bfloat16 on SM90, also
    float32 on SM100."""
    fake_deep_gemm.arch = arch
    x, w = randn(m, K, seed=m), randn(N, K, seed=200 + m)
    prepared = fp8quant.prepare_weight(w, "deep_gemm", arch=arch)
    want = expected_product(x, w, recipe("deep_gemm", arch))
    xq = fp8quant.quantize_activation(x, prepared.recipe)
    for inp in (x, xq):
        assert torch.equal(fp8quant.linear(inp, prepared), want.to(torch.bfloat16))
    calls = 2
    if arch == 10:
        tol = 1e-5 * want.abs().max().item()
        for inp in (x, xq):
            got = fp8quant.linear(inp, prepared, out_dtype=torch.float32)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=tol)
        calls = 4
    assert fake_deep_gemm.calls == [(m, N, K)] * calls and fake_deep_gemm.sf_copies == 0
    with pytest.raises(ValueError, match=r"^out_dtype torch.float16 is not one 'deep_gemm sm"):
        fp8quant.linear(x, prepared, out_dtype=torch.float16)


def test_deep_gemm_float32_output_refused_on_sm90(fake_deep_gemm, monkeypatch):
    """DeepGEMM 2.6.1 on SM90 asserts a bfloat16 D inside (sm90_fp8_gemm_1d2d.hpp): linear refuses
    out_dtype=torch.float32 first, naming it, on the GPU's arch (the recipe's for CPU tensors);
    SM100's 1D1D kernel writes float32."""
    x = randn(4, K, seed=11)
    w9 = fp8quant.prepare_weight(randn(N, K, seed=12), "deep_gemm", arch=9)
    w10 = fp8quant.prepare_weight(randn(N, K, seed=12), "deep_gemm", arch=10)
    refused = r"^out_dtype torch.float32: SM90's DeepGEMM \(fp8_gemm_nt's 1D2D kernel\) writes bfloat16 only"
    for inp in (x, fp8quant.quantize_activation(x, w9.recipe)):
        with pytest.raises(ValueError, match=refused):
            fp8quant.linear(inp, w9, out_dtype=torch.float32)
    with pytest.raises(ValueError, match=refused):  # refused up front, whatever M
        fp8quant.linear(randn(0, K), w9, out_dtype=torch.float32)
    assert fake_deep_gemm.calls == []
    with pytest.raises(RuntimeError, match=r"not c.has_value\(\) and d.scalar_type\(\) == torch::kBFloat16"):
        gemm._deep_gemm(fp8quant.quantize_activation(x, w9.recipe), w9, torch.float32)  # what it saves
    fake_deep_gemm.arch = 10
    assert fp8quant.linear(x, w10, out_dtype=torch.float32).dtype == torch.float32
    monkeypatch.setattr(gemm, "_device_arch", lambda device: 9)  # the GPU's capability decides
    with pytest.raises(ValueError, match=refused):
        fp8quant.linear(x, w9, out_dtype=torch.float32)
    monkeypatch.setattr(gemm, "_device_arch", lambda device: 10)
    assert fp8quant.linear(x, w10, out_dtype=torch.float32).dtype == torch.float32
    gemm._check_deep_gemm_out_dtype(torch.bfloat16, 9)
    gemm._check_deep_gemm_out_dtype(torch.float32, 10)
    with pytest.raises(ValueError, match=refused):
        gemm._check_deep_gemm_out_dtype(torch.float32, 9)


def test_deep_gemm_weight_for_another_gpu(fake_deep_gemm, monkeypatch):
    """A weight prepared for one arch's DeepGEMM on a GPU of the other: DeepGEMM would read its
    scales as the other format without an error (SM100 keeps only the exponents of fp32 scales),
    so linear refuses it, naming the recipe and the GPU."""
    x = randn(4, K, seed=11)
    w9 = fp8quant.prepare_weight(randn(N, K, seed=12), "deep_gemm", arch=9)
    w10 = fp8quant.prepare_weight(randn(N, K, seed=12), "deep_gemm", arch=10)
    monkeypatch.setattr(gemm, "_device_arch", lambda device: 10)
    with pytest.raises(fp8quant.FormatMismatchError, match=r"^the weight was prepared for 'deep_gemm sm90' .* sm_10x"):
        fp8quant.linear(x, w9)
    monkeypatch.setattr(gemm, "_device_arch", lambda device: 9)
    with pytest.raises(fp8quant.FormatMismatchError, match=r"^the weight was prepared for 'deep_gemm sm100' .* sm_9x"):
        fp8quant.linear(x, w10)
    assert fake_deep_gemm.calls == []
    fp8quant.linear(x, w9)  # the matching GPU


def find_deep_gemm_wheel() -> Path | None:
    """The DeepGEMM 2.6.1 wheel built for the H200 (shared/wheels, beside or inside the checkout)."""
    root = Path(__file__).resolve().parents[2]
    wheels = (root / "shared" / "wheels" / DEEP_GEMM_WHEEL, root.parent / "shared" / "wheels" / DEEP_GEMM_WHEEL)
    return next((w for w in wheels if w.is_file()), None)


def test_deep_gemm_stand_in_signature():
    """The stand-in's fp8_gemm_nt takes DeepGEMM 2.6.1's parameters (names, order, defaults), and
    so does the wheel's stub of fp8_fp4_gemm_nt (fp8_gemm_nt is its alias), where the wheel is."""
    params = inspect.signature(deep_gemm_stand_in().fp8_gemm_nt).parameters.values()
    assert tuple((p.name, p.default) for p in params) == DEEP_GEMM_2_6_1_FP8_GEMM_NT
    wheel = find_deep_gemm_wheel()
    if wheel is None:
        pytest.skip(f"{DEEP_GEMM_WHEEL} is not here: the stub was not compared")
    with zipfile.ZipFile(wheel) as z:
        stub = ast.parse(z.read("deep_gemm/_C.pyi").decode())
        init = z.read("deep_gemm/__init__.py").decode()
    assert "fp8_gemm_nt, fp8_gemm_nn" in init  # imported from _C
    fn = next(f for f in stub.body if isinstance(f, ast.FunctionDef) and f.name == "fp8_fp4_gemm_nt")
    defaults = [inspect.Parameter.empty] * (len(fn.args.args) - len(fn.args.defaults))
    defaults += [ast.literal_eval(d) for d in fn.args.defaults]
    assert tuple(zip((a.arg for a in fn.args.args), defaults)) == DEEP_GEMM_2_6_1_FP8_GEMM_NT


def stand_in_operands(arch: int, m: int = 4) -> dict:
    """Operands fp8quant hands fp8_gemm_nt on ``arch``, as keyword arguments."""
    x, w = randn(m, K, seed=13), randn(N, K, seed=14)
    wq = fp8quant.prepare_weight(w, "deep_gemm", arch=arch)
    xq = fp8quant.quantize_activation(x, wq.recipe)
    d = torch.empty((m, N), dtype=torch.bfloat16)
    return {"a": (xq.q, xq.scale), "b": (wq.q, wq.scale), "d": d}


def mn_major(sf: torch.Tensor, rows: int) -> torch.Tensor:
    """sf's values, MN-major with columns ``rows`` apart."""
    buf = sf.new_zeros((sf.shape[1], rows))
    buf[:, : sf.shape[0]] = sf.t()
    return buf[:, : sf.shape[0]].t()


def sm90_padded_sfb(ops):
    """scaled_mm's weight scales: the [nb, kb] view of a [nb, 8] buffer (DeepGEMM refuses them)."""
    w_s = fp8quant.prepare_weight(randn(N, K, seed=14), "scaled_mm", arch=9).scale
    return {**ops, "b": (ops["b"][0], w_s)}


@pytest.mark.parametrize(
    "arch, change, condition",
    [
        (9, lambda o: {**o, "d": o["d"].float()}, r"not c.has_value\(\) and d.scalar_type\(\) == torch::kBFloat16"),
        (9, lambda o: {**o, "c": o["d"].clone()}, r"not c.has_value\(\) and d.scalar_type\(\) == torch::kBFloat16"),
        (9, lambda o: {**o, "d": o["d"].half()}, r"d.scalar_type\(\) == torch::kBFloat16 or d.scalar_type\(\) == torch::kFloat"),
        (9, lambda o: {**o, "d": o["d"].t().contiguous().t()}, r"t.stride\(-1\) == 1"),
        (9, lambda o: {**o, "a": (o["a"][0].t().contiguous().t(), o["a"][1])}, r"major_a == cute::UMMA::Major::K"),
        (9, lambda o: {**o, "a": (o["a"][0].view(torch.uint8), o["a"][1])}, r"ab.scalar_type\(\) == kPackedFP4"),
        (9, lambda o: {**o, "d": o["d"][:, :128]}, r"m == m_ and n == n_ and k == k_"),
        (9, sm90_padded_sfb, r"\(sf.stride\(-1\) == 1 and sf.stride\(-2\) == sf.size\(-1\)\) or"),
        (9, lambda o: {**o, "a": (o["a"][0], o["a"][1][:, :4])}, r"sf.size\(-1\) == ceil_div\(k, gran_k"),
        (9, lambda o: {**o, "b": (o["b"][0], o["b"][1][:1])}, r"sf.size\(-2\) == ceil_div\(mn, gran_mn\)"),
        (9, lambda o: {**o, "recipe": (1, 128, 128), "recipe_a": (1, 128), "recipe_b": (128, 128)}, r"recipe_a.has_value\(\) != recipe.has_value\(\)"),
        (9, lambda o: {**o, "recipe_a": (1, 128)}, r"recipe_a.has_value\(\) == recipe_b.has_value\(\)"),
        (9, lambda o: {**o, "recipe": (1, 1, 128)}, r"sf.size\(-2\) == ceil_div\(mn, gran_mn\)"),
        (9, lambda o: {**o, **stand_in_operands(10)}, r"sfa_dtype == torch::kFloat and sfb_dtype == torch::kFloat"),
        (9, lambda o: {**o, **stand_in_operands(10), "recipe": (1, 1, 128)}, r"Unknown SF transformation"),
        (10, lambda o: {**o, "a": (o["a"][0], mn_major(o["a"][1], 8))}, r"sf.stride\(-1\) == get_tma_aligned_size\(mn, sf.element_size\(\)\)"),
        (10, lambda o: {**o, "b": (o["b"][0], o["b"][1].contiguous())}, r"sf.stride\(-2\) == 1 or mn == 1"),
        (10, lambda o: {**o, "recipe": (1, 128, 128)}, r"sf.size\(-2\) == ceil_div\(mn, gran_mn\)"),
        (10, lambda o: {**o, "d": o["d"].half()}, r"d.scalar_type\(\) == torch::kBFloat16 or d.scalar_type\(\) == torch::kFloat"),
    ],
)  # fmt: skip
def test_deep_gemm_stand_in_refuses_what_2_6_1_refuses(arch, change, condition):
    """The stand-in raises DeepGEMM 2.6.1's RuntimeError (its condition text) where 2.6.1's host code
    asserts; fp8quant's own operands pass, with float32 output only on SM100."""
    fake = deep_gemm_stand_in()
    fake.arch = arch
    ops = stand_in_operands(arch)
    with pytest.raises(RuntimeError, match=rf"^Assertion error \(deep_gemm 2.6.1 stand-in\): .*{condition}"):
        fake.fp8_gemm_nt(**change(ops))
    assert fake.calls == []
    fake.fp8_gemm_nt(**ops)
    if arch == 10:
        fake.fp8_gemm_nt(**{**ops, "d": ops["d"].float()}, recipe=(1, 1, 128))
    assert fake.sf_copies == 0 and len(fake.calls) == (2 if arch == 10 else 1)


def test_deep_gemm_stand_in_accepts_what_2_6_1_accepts():
    """Row-major activation scales on SM90 (DeepGEMM copies them into its layout), the weight scales'
    exact transpose, an empty M, and the legacy fp32 scales on SM100 (packed by their exponent bits)."""
    fake = deep_gemm_stand_in()
    ops = stand_in_operands(9)
    (a_q, sfa), (b_q, sfb) = ops["a"], ops["b"]
    fake.fp8_gemm_nt(**ops)
    want = ops["d"].clone()
    fake.fp8_gemm_nt((a_q, sfa.contiguous()), (b_q, sfb.t().contiguous().t()), ops["d"])
    assert fake.sf_copies == 1 and torch.equal(ops["d"], want)
    fake.fp8_gemm_nt((a_q[:0], sfa[:0]), (b_q, sfb), ops["d"][:0].float())  # early return: nothing checked
    assert len(fake.calls) == 2
    fake.arch = 10
    x, w = randn(4, K, seed=13), randn(N, K, seed=14)
    q, s = reference.per_token_group_quant(x, 128, ue8m0=True)
    wq, ws = reference.per_block_quant(w, ue8m0=True)
    d = torch.empty((4, N), dtype=torch.float32)
    fake.fp8_gemm_nt((q, s), (wq, ws), d)
    want = expected_product(x, w, recipe("deep_gemm", 10))
    torch.testing.assert_close(d.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_deep_gemm_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    w = fp8quant.prepare_weight(randn(N, K), "deep_gemm", arch=9)
    with pytest.raises(ImportError, match=r"^backend 'deep_gemm sm90' needs DeepGEMM \(the deep_gemm package\), which "
                                          r"does not import: ModuleNotFoundError"):  # fmt: skip
        fp8quant.linear(randn(2, K), w)


class BrokenDeepGemmFinder:
    """A meta-path finder for a ``deep_gemm`` that is installed (find_spec finds it) but whose
    import raises, as when its extension cannot load libcuda."""

    def __init__(self) -> None:
        self.imports = 0

    def find_spec(self, name, path=None, target=None):
        if name != "deep_gemm":
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.imports += 1
        raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")


def test_auto_needs_deep_gemm_to_import(monkeypatch):
    """A deep_gemm that find_spec finds but that does not import is not chosen: "auto" falls back,
    with one warning naming the import error, and the import is tried once."""
    finder = BrokenDeepGemmFinder()
    monkeypatch.delitem(sys.modules, "deep_gemm", raising=False)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    assert importlib.util.find_spec("deep_gemm") is not None  # what "auto" used to go by
    with pytest.warns(UserWarning, match=r"^deep_gemm is installed but does not import \(ImportError: libcuda.so.1: "
                                         r"cannot open shared object file") as caught:  # fmt: skip
        assert fp8quant.select_backend(4096, 7168, "cpu", arch=9) is recipe("scaled_mm", 9)
        assert fp8quant.select_backend(4096, 7168, "cpu", arch=10) is recipe("reference", 0)
        w = fp8quant.prepare_weight(randn(N, K), arch=9)
    assert len(caught) == 1 and finder.imports == 1
    assert w.recipe is recipe("scaled_mm", 9)
    w = fp8quant.prepare_weight(randn(N, K), "deep_gemm", arch=9)  # named: refused, naming the error
    with pytest.raises(ImportError, match=r"^backend 'deep_gemm sm90' needs DeepGEMM .*: ImportError: libcuda.so.1"):
        fp8quant.linear(randn(2, K), w)
    assert finder.imports == 1


def test_auto_without_deep_gemm_is_quiet(monkeypatch):
    """No deep_gemm package at all: "auto" picks another backend without a warning."""
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fp8quant.select_backend(4096, 7168, "cpu", arch=9) is recipe("scaled_mm", 9)
        assert fp8quant.select_backend(4096, 7168, "cpu", arch=10) is recipe("reference", 0)


@pytest.fixture
def fake_scaled_mm(monkeypatch):
    """torch._scaled_mm and torch.nn.functional.scaled_mm stand-ins that check what torch 2.11
    checks on an H200 (docs/backends.md) and compute with the float64 dequantized operands."""
    calls = []

    def check_a(a, scale_a):
        mp, k = a.shape
        assert a.dtype == FP8 and mp % 4 == 0 and a.stride() == (k, 1)
        assert scale_a.dtype == torch.float32 and scale_a.shape == (mp, k // 128)
        assert scale_a.stride(0) == 1 and (scale_a.stride(1) == mp or scale_a.shape[1] == 1)
        return mp, k

    def product(a, b, scale_a, ws, out_dtype):
        wfmt = WeightFormat("block", False)
        y = dequant_activation(a, scale_a, ActivationFormat("mn_tma", False)) @ dequant_weight(b.t(), ws, wfmt).t()
        return y.to(out_dtype)

    def scaled_mm_v1(a, b, scale_a, scale_b, *, out_dtype):
        mp, k = check_a(a, scale_a)
        n, kb = b.shape[1], -(-k // 128)
        assert b.dtype == FP8 and b.stride() == (1, k) and kb % 4 == 0  # otherwise cuBLASLt misreads scale_b
        assert scale_b.shape == (kb, -(-n // 128)) and scale_b.stride() == (1, kb)
        calls.append("v1")
        return product(a, b, scale_a, scale_b.t(), out_dtype)

    def scaled_mm_v2(a, b, scale_a, recipe_a, scale_b, recipe_b, *, output_dtype):
        mp, k = check_a(a, scale_a)
        n, kb, l4 = b.shape[1], -(-k // 128), fp8quant.layouts.align(-(-k // 128), 4)
        assert recipe_a == "BlockWise1x128" and recipe_b == "BlockWise128x128"
        assert scale_b.shape == (l4, -(-n // 128)) and scale_b.stride() == (1, l4)
        assert not scale_b[kb:].any()  # the padding rows of the weight scales
        calls.append("v2")
        return product(a, b, scale_a, scale_b.t()[:, :kb], output_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm_v1)
    monkeypatch.setattr(torch.nn.functional, "scaled_mm", scaled_mm_v2, raising=False)
    scaling = types.SimpleNamespace(BlockWise1x128="BlockWise1x128", BlockWise128x128="BlockWise128x128")
    monkeypatch.setattr(torch.nn.functional, "ScalingType", scaling, raising=False)
    return calls


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("k", [512, 640])
@pytest.mark.parametrize("m", MS)
def test_scaled_mm_operands(fake_scaled_mm, monkeypatch, m, k, traced):
    """What linear hands torch._scaled_mm on the GPU, built here on the CPU: M padded to 4 (zero
    rows), activation scales of strides exactly (1, Mp), weight scales transposed; K with kb % 4
    != 0 through F.scaled_mm with the padded buffer. ``traced``: the torch.compile route (x
    padded before quantization)."""
    monkeypatch.setattr(gemm, "tracing", lambda: traced)
    x, w = randn(m, k, seed=m), randn(N, k, seed=300 + m)
    r = recipe("scaled_mm", 9)
    prepared = fp8quant.prepare_weight(w, r)
    want = expected_product(x, w, r)
    a_q, a_s = gemm._quantize_padded(x, r.activation)
    mp = fp8quant.layouts.align(m, 4)
    assert a_q.shape == (mp, k) and not a_q[m:].view(torch.uint8).any()
    got = gemm._scaled_mm(a_q, a_s, prepared, torch.float32)[:m]
    assert fake_scaled_mm == ["v1" if k == 512 else "v2"]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    xq = fp8quant.quantize_activation(x, r)
    q_full, s_full = gemm._pad_rows(xq)
    assert torch.equal(gemm._scaled_mm(q_full, s_full, prepared, torch.float32)[:m], got)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile(dynamic):
    """linear under torch.compile(fullgraph=True) on the CPU (the scaled_mm recipe, whose CPU path is
    the reference): recipes and formats are traced through (under dynamic=True their integers
    become symbolic: Dynamo alone, aot_eager's fake tensors being the static case's), and the
    result is the eager one."""
    torch._dynamo.reset()
    w = fp8quant.prepare_weight(randn(N, K, seed=10), "scaled_mm", arch=9)
    backend = "eager" if dynamic else "aot_eager"
    fns = [torch.compile(lambda x: fp8quant.linear(x * 1, w), fullgraph=True, backend=backend, dynamic=dynamic)]
    if not dynamic:  # a QuantizedActivation's checks too (once: compiling is most of this file's time)
        fns.append(torch.compile(lambda x: fp8quant.linear(fp8quant.quantize_activation(x * 1, w.recipe), w),
                                 fullgraph=True, backend="aot_eager"))  # fmt: skip
    for m in (3, 8):
        x = randn(m, K, seed=m)
        want = fp8quant.linear(x, w)
        assert all(torch.equal(fn(x), want) for fn in fns)
    torch._dynamo.reset()


def test_calc_diff():
    x = torch.tensor([1.0, 2.0])
    assert calc_diff(x, x) == 0.0
    assert calc_diff(x, -x) == 2.0
    assert calc_diff(x, torch.zeros(2)) == 1.0
    assert calc_diff(x, 2 * x) == pytest.approx(0.2, abs=1e-15)  # 1 - 2*10 / (5 + 20)
    assert calc_diff(torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])) == 1.0  # orthogonal
    big = torch.full((4,), 1e30)  # float64: no overflow
    assert calc_diff(big, big) == 0.0


# --- bench --gemm (the GPU bench itself runs in the GPU suite's machine) ---------------------------


def test_gemm_bench_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the GEMM bench runs there")
    args = build_parser().parse_args(["bench", "--gemm"])
    with pytest.raises(SystemExit, match=r"^--gemm times GEMMs on a CUDA GPU; none was found$"):
        args.run(args)


def test_gemm_bench_arithmetic():
    from fp8quant.bench import gemm as bench_gemm  # noqa: PLC0415

    assert bench_gemm.fp8_bytes(4, 256, 7168) == 4 * 7168 + 256 * 7168 + 4 * (4 * 56 + 2 * 56) + 2 * 4 * 256
    four = bench_gemm.fp8_bytes(4, 256, 7168)
    assert bench_gemm.fp8_bytes(3, 256, 7168) == four - 7168 - 2 * 256  # one row fewer; scales padded to 4 either way
    assert bench_gemm.bf16_bytes(1, 128, 128) == 2 * (128 + 128 * 128 + 128)
    assert bench_gemm.SHAPES[0] == (4096, 7168) and len(bench_gemm.SHAPES) == 6
