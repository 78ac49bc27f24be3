"""fp8quant.grouped_gemm: the Triton grouped block-FP8 GEMMs in DeepGEMM's MoE layouts and their
PyTorch path.

On the CPU (always): argument checks (type and message, the same from the Triton entry points and
the PyTorch path), the missing-Triton error, the tile table, and grouped_gemm_torch against a
float64 sum written out per 128-wide K block (DeepGEMM's formula) on tiny contiguous and masked
cases whose padding rows hold NaN and whose d keeps its poison outside the valid rows.

On the GPU (marked ``gpu``): both kernels against grouped_gemm_torch (calc_diff < 1e-5 and
element-wise within bf16 rounding) for every tile config, experts with 0, 1, 129, ... rows, padded
strides, N not a multiple of the tile, DeepSeek-V3's shapes; NaN in every padding row of a_q and
a_s changes no bit of the output against zero padding, and padding rows of d keep their poison;
CUDA-graph capture and replay with new routings."""

from __future__ import annotations

import pytest
import torch

from fp8quant import grouped_gemm as gg
from fp8quant import reference
from fp8quant.gemm import calc_diff
from fp8quant.layouts import empty_scale

FP8 = torch.float8_e4m3fn
BF16_POISON = 0x7FAD  # a NaN as bfloat16, never a product written here
FP8_NAN = 0x7F


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def mn_tma_copy(s: torch.Tensor) -> torch.Tensor:
    """A copy of mn_tma scales ``[*batch, m, g]`` with the same strides (clone() would compact
    them)."""
    out = empty_scale("mn_tma", s.shape[-2], s.shape[-1], tuple(s.shape[:-2]), device=s.device)
    return out.copy_(s)


def poisoned_d(shape, device, row_pad: int = 0) -> torch.Tensor:
    """bf16 ``shape`` full of the NaN poison, optionally inside rows wider by ``row_pad``."""
    buf = torch.empty((*shape[:-1], shape[-1] + row_pad), dtype=torch.bfloat16, device=device)
    buf.view(torch.int16).fill_(BF16_POISON)
    return buf[..., : shape[-1]]


def is_poison(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) == BF16_POISON


def weights(e: int, n: int, k: int, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn((e, n, k), generator=gen, device=device) * 0.05
    return reference.per_block_quant(w)


def segments(counts, extra_rows: int) -> torch.Tensor:
    """m_indices of experts with ``counts`` rows, each segment 128-row aligned, then
    ``extra_rows`` padding rows (a max_m_sum bound above M_sum)."""
    ids = []
    for e, c in enumerate(counts):
        ids += [e] * c + [-1] * (-c % 128)
    return torch.tensor(ids + [-1] * extra_rows, dtype=torch.int32)


def contiguous_inputs(counts, n, k, gen, device, *, extra_rows=256, row_pad=0):
    """``(a_q, a_s), (w_q, w_s), m_indices`` of the contiguous layout; a_q rows ``row_pad``
    elements wider than K when asked."""
    m_indices = segments(counts, extra_rows).to(device)
    m = m_indices.numel()
    x = torch.randn((m, k), generator=gen, device=device)
    q, a_s = reference.per_token_group_quant(x, 128, scale_layout="mn_tma")
    a_q = torch.empty((m, k + row_pad), dtype=FP8, device=device)[:, :k]
    a_q.copy_(q)
    return (a_q, a_s), weights(len(counts), n, k, gen, device), m_indices


def masked_inputs(counts, max_m, n, k, gen, device):
    e = len(counts)
    x = torch.randn((e, max_m, k), generator=gen, device=device)
    a = reference.per_token_group_quant(x, 128, scale_layout="mn_tma")
    masked_m = torch.tensor(counts, dtype=torch.int32, device=device)
    return a, weights(e, n, k, gen, device), masked_m


def padding_rows(*, m_indices=None, masked_m=None, max_m=None, num_experts=None) -> torch.Tensor:
    """bool mask of the rows no expert owns: ``[M]`` or ``[E, max_m]``."""
    if m_indices is not None:
        return (m_indices < 0) | (m_indices >= num_experts)
    return torch.arange(max_m, device=masked_m.device)[None, :] >= masked_m.clamp(0, max_m)[:, None]


def with_padding(a, pad: torch.Tensor, nan: bool):
    """Copies of ``a = (a_q, a_s)`` whose padding rows hold NaN (0x7F bytes, NaN scales) or zeros."""
    a_q, a_s = a
    q = torch.empty_like(a_q) if a_q.is_contiguous() else a_q.new_empty(a_q.shape[:-1] + (a_q.stride(-2),))
    q = q[..., : a_q.shape[-1]].copy_(a_q)
    s = mn_tma_copy(a_s)
    q.view(torch.uint8)[pad] = FP8_NAN if nan else 0
    s[pad] = float("nan") if nan else 0.0
    return q, s


# --------------------------------------------------------------------------------------------
# CPU: the PyTorch path against a float64 sum per K block
# --------------------------------------------------------------------------------------------


def block_sum_f64(a_q, a_s, w_q, w_s) -> torch.Tensor:
    """``sum_kb (a_q[:, kb] . w_q[:, kb]) * a_s[:, kb] * w_s[n // 128, kb]`` in float64 for rows
    ``a_q [R, K]`` of one expert's ``w_q [N, K]``: ``[R, N]``."""
    r, k = a_q.shape
    n, g = w_q.shape[0], k // 128
    dots = torch.einsum("rgk,ngk->rng", a_q.double().view(r, g, 128), w_q.double().view(n, g, 128))
    w_rows = w_s.double().repeat_interleave(128, dim=0)[:n]  # [N, g]
    return (dots * a_s.double()[:, None, :] * w_rows[None, :, :]).sum(-1)


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` (bf16) is ``want`` rounded to bf16, give or take one bf16 step."""
    want = want.double()
    err = (got.double() - want).abs()
    bound = 2.0**-7 * want.abs() + 1e-6 * want.abs().max()
    assert bool((err <= bound).all()), f"max error {float(err.max())}"


@pytest.mark.parametrize("n", [128, 200])
def test_torch_contiguous_against_float64(n):
    gen = torch.Generator().manual_seed(1)
    e, k = 2, 256
    m_indices = torch.tensor([0, 0, 0, -1, 1, 1, -1, -1, 1, 2], dtype=torch.int32)  # id 2 = E: not an expert
    m = m_indices.numel()
    x = torch.randn((m, k), generator=gen)
    a = reference.per_token_group_quant(x, 128, scale_layout="mn_tma")
    w_q, w_s = weights(e, n, k, gen, "cpu")
    pad = padding_rows(m_indices=m_indices, num_experts=e)
    a_q, a_s = with_padding(a, pad, nan=True)
    d = poisoned_d((m, n), "cpu")
    gg.grouped_gemm_torch((a_q, a_s), (w_q, w_s), d, m_indices=m_indices)
    assert bool(is_poison(d[pad]).all())
    for expert in range(e):
        rows = (m_indices == expert).nonzero().squeeze(1)
        assert_bf16_close(d[rows], block_sum_f64(a_q[rows], a_s[rows], w_q[expert], w_s[expert]))


def test_torch_masked_against_float64():
    gen = torch.Generator().manual_seed(2)
    max_m, n, k = 5, 128, 256
    counts = [3, 0, 9]  # 9 > max_m: clamped, every row of expert 2
    a, (w_q, w_s), masked_m = masked_inputs(counts, max_m, n, k, gen, "cpu")
    pad = padding_rows(masked_m=masked_m, max_m=max_m)
    a_q, a_s = with_padding(a, pad, nan=True)
    assert a_s.stride() == (8 * 2, 1, 8)  # Ma = 8, G = 2
    d = poisoned_d((3, max_m, n), "cpu")
    gg.grouped_gemm_torch((a_q, a_s), (w_q, w_s), d, masked_m=masked_m)
    assert bool(is_poison(d[pad]).all())
    for expert, count in enumerate(min(c, max_m) for c in counts):
        if count == 0:
            continue
        want = block_sum_f64(a_q[expert, :count], a_s[expert, :count], w_q[expert], w_s[expert])
        assert_bf16_close(d[expert, :count], want)


# --------------------------------------------------------------------------------------------
# CPU: argument checks
# --------------------------------------------------------------------------------------------


def contiguous_args(m=8, e=2, n=128, k=256):
    m_indices = torch.tensor([0] * (m // 2) + [1] * (m - m // 2), dtype=torch.int32)
    a_q = torch.zeros((m, k), dtype=FP8)
    a_s = empty_scale("mn_tma", m, k // 128).fill_(1)
    w_q = torch.zeros((e, n, k), dtype=FP8)
    w_s = torch.ones((e, -(-n // 128), k // 128))
    return {"a": (a_q, a_s), "b": (w_q, w_s), "d": torch.zeros((m, n), dtype=torch.bfloat16), "m_indices": m_indices}


def masked_args(e=2, max_m=6, n=128, k=256):
    a_q = torch.zeros((e, max_m, k), dtype=FP8)
    a_s = empty_scale("mn_tma", max_m, k // 128, (e,)).fill_(1)
    w_q = torch.zeros((e, n, k), dtype=FP8)
    w_s = torch.ones((e, -(-n // 128), k // 128))
    d = torch.zeros((e, max_m, n), dtype=torch.bfloat16)
    return {"a": (a_q, a_s), "b": (w_q, w_s), "d": d, "masked_m": torch.tensor([1, 6], dtype=torch.int32)}


def replace(args: dict, name: str, index: int | None, value) -> dict:
    args = dict(args)
    if index is None:
        args[name] = value
    else:
        pair = list(args[name])
        pair[index] = value
        args[name] = tuple(pair)
    return args


C, MK = contiguous_args(), masked_args()
CONTIGUOUS_ERRORS = [
    ("a", None, C["a"][0], TypeError, r"^a must be a pair of tensors"),
    ("a", 0, C["a"][0].float(), TypeError, r"^a\[0\] \(a_q\) must be float8_e4m3fn \[M, K\]"),
    ("a", 0, torch.zeros((8, 200), dtype=FP8), ValueError, r"^K = 200 .* must be a positive multiple of 128"),
    ("a", 0, torch.zeros((256, 8), dtype=FP8).t(), ValueError, r"^a\[0\] \(a_q\) must be row-major"),
    ("a", 1, torch.ones((8, 2)), ValueError, r"^a\[1\] \(a_s\) must have strides \(1, 8\) \(column-major"),
    ("a", 1, torch.ones((2, 8)).t()[:7], ValueError, r"^a\[1\] \(a_s\) must have shape \(8, 2\)"),
    ("a", 1, torch.ones((2, 8), dtype=torch.float16).t(), TypeError, r"^a\[1\] \(a_s\) must be torch.float32"),
    ("b", 0, torch.zeros((2, 256, 128), dtype=FP8).transpose(1, 2), ValueError, r"^b\[0\] \(w_q\) must be contig"),
    ("b", 0, torch.zeros((2, 128, 384), dtype=FP8), ValueError, r"^b\[0\] \(w_q\) must have K = 256"),
    ("b", 0, torch.zeros((128, 256), dtype=FP8), TypeError, r"^b\[0\] \(w_q\) must be float8_e4m3fn \[E, N, K\]"),
    ("b", 1, torch.ones((2, 1, 3)), ValueError, r"^b\[1\] \(w_s\) must have shape \(2, 1, 2\)"),
    ("b", 1, torch.ones((2, 2, 2))[:, :1], ValueError, r"^b\[1\] \(w_s\) must be contiguous"),
    ("d", None, torch.zeros((8, 128)), TypeError, r"^d must be torch.bfloat16, got torch.float32"),
    ("d", None, torch.zeros((8, 64), dtype=torch.bfloat16), ValueError, r"^d must have shape \(8, 128\)"),
    ("d", None, torch.zeros((128, 8), dtype=torch.bfloat16).t(), ValueError, r"^d must be row-major"),
    ("m_indices", None, torch.zeros(8, dtype=torch.int64), TypeError, r"^m_indices must be torch.int32"),
    ("m_indices", None, torch.zeros(9, dtype=torch.int32), ValueError, r"^m_indices must have shape \(8,\)"),
    ("m_indices", None, torch.zeros(16, dtype=torch.int32)[::2], ValueError, r"^m_indices must be contiguous"),
    ("m_indices", None, torch.zeros(8, dtype=torch.int32, device="meta"), ValueError,
     r"^m_indices is on meta, a\[0\] on cpu: every tensor must be on one device"),
]  # fmt: skip
MASKED_ERRORS = [
    ("a", 0, torch.zeros((6, 256), dtype=FP8), TypeError, r"^a\[0\] \(a_q\) must be float8_e4m3fn \[E, max_m, K\]"),
    ("a", 1, torch.ones((2, 6, 2)), ValueError, r"^a\[1\] \(a_s\) must have strides \(16, 1, 8\) \(per expert"),
    ("b", 0, torch.zeros((3, 128, 256), dtype=FP8), ValueError, r"^b\[0\] \(w_q\) must have E = 2 experts"),
    ("d", None, torch.zeros((2, 6, 256), dtype=torch.bfloat16), ValueError, r"^d must have shape \(2, 6, 128\)"),
    ("masked_m", None, torch.zeros(3, dtype=torch.int32), ValueError, r"^masked_m must have shape \(2,\)"),
    ("masked_m", None, [1, 6], TypeError, r"^masked_m must be a torch.Tensor, got list"),
]  # fmt: skip


@pytest.mark.parametrize("name, index, value, error, message", CONTIGUOUS_ERRORS)
def test_contiguous_argument_errors(name, index, value, error, message):
    args = replace(C, name, index, value)
    with pytest.raises(error, match=message):
        gg.grouped_gemm_contiguous(**args)
    with pytest.raises(error, match=message):
        gg.grouped_gemm_torch(**args)


@pytest.mark.parametrize("name, index, value, error, message", MASKED_ERRORS)
def test_masked_argument_errors(name, index, value, error, message):
    args = replace(MK, name, index, value)
    with pytest.raises(error, match=message):
        gg.grouped_gemm_masked(**args, expected_m=4)
    with pytest.raises(error, match=message):
        gg.grouped_gemm_torch(**args)


def test_expected_m_and_layout_choice_errors():
    with pytest.raises(TypeError, match=r"^expected_m must be an int"):
        gg.grouped_gemm_masked(**MK, expected_m=2.5)
    with pytest.raises(TypeError, match=r"^expected_m must be an int"):
        gg.grouped_gemm_masked(**MK, expected_m=True)
    with pytest.raises(ValueError, match=r"^expected_m must be >= 0, got -1"):
        gg.grouped_gemm_contiguous(**C, expected_m=-1)
    with pytest.raises(ValueError, match=r"^pass exactly one of m_indices"):
        gg.grouped_gemm_torch(MK["a"], MK["b"], MK["d"])
    with pytest.raises(ValueError, match=r"^pass exactly one of m_indices"):
        gg.grouped_gemm_torch(C["a"], C["b"], C["d"], m_indices=C["m_indices"], masked_m=MK["masked_m"])


def test_without_triton_or_cuda(monkeypatch):
    monkeypatch.setattr(gg, "triton", None)
    assert gg.available() is False
    with pytest.raises(RuntimeError, match=r"need Triton.*grouped_gemm_torch computes the same products"):
        gg.grouped_gemm_contiguous(**C)
    with pytest.raises(RuntimeError, match=r"need Triton"):
        gg.grouped_gemm_masked(**MK, expected_m=1)
    monkeypatch.setattr(gg, "triton", object())  # "importable": CPU tensors are still refused
    with pytest.raises(ValueError, match=r"take CUDA tensors, got tensors on cpu"):
        gg.grouped_gemm_masked(**MK, expected_m=1)


def test_kernel_config_table():
    assert gg.kernel_config(None, contiguous=True).block_m == 64
    assert gg.kernel_config(0).block_m == gg.kernel_config(1).block_m == gg.kernel_config(16).block_m == 16
    assert gg.kernel_config(10**6).block_m == 128
    assert gg.kernel_config(None) == gg.kernel_config(10**6)
    for expected_m in (None, 0, 1, 16, 17, 32, 33, 64, 65, 200, 4096):
        for contiguous in (False, True):
            cfg = gg.kernel_config(expected_m, contiguous=contiguous)
            assert 16 <= cfg.block_m <= 128 and 128 % cfg.block_m == 0
            assert cfg.block_n % 16 == 0 and cfg.num_warps in (4, 8) and cfg.num_stages >= 2


# --------------------------------------------------------------------------------------------
# GPU: the Triton kernels
# --------------------------------------------------------------------------------------------

BOUND = 1e-5  # calc_diff against grouped_gemm_torch: bf16 rounding only
HINTS = [None, 1, 16, 32, 64, 200]  # every row of the tile table


def compare(d: torch.Tensor, ref: torch.Tensor, pad: torch.Tensor) -> None:
    """Valid rows finite and within bf16 rounding of the oracle; padding rows still poison."""
    valid = ~pad
    got, want = d[valid], ref[valid]
    assert bool(torch.isfinite(got).all())
    if want.numel():
        assert calc_diff(got, want) < BOUND
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-2)
    assert bool(is_poison(d[pad]).all()), "a padding row of d was written"


def run_contiguous(a, b, m_indices, n, hint, row_pad=0):
    d = poisoned_d((m_indices.numel(), n), "cuda", row_pad)
    gg.grouped_gemm_contiguous(a, b, d, m_indices, expected_m=hint)
    return d


def run_masked(a, b, masked_m, n, expected_m):
    d = poisoned_d((*a[0].shape[:2], n), "cuda")
    gg.grouped_gemm_masked(a, b, d, masked_m, expected_m)
    return d


@pytest.mark.gpu
@pytest.mark.parametrize("hint", HINTS)
@pytest.mark.parametrize(
    "counts, n, k, row_pad",
    [
        ([1, 0, 129, 37], 384, 512, 0),
        ([129, 1, 0, 200, 5, 0, 64, 300], 256, 1024, 128),
        ([3, 128, 0, 1, 250], 200, 256, 0),  # N not a multiple of 64 or 128
    ],
)
def test_contiguous(counts, n, k, row_pad, hint, gen):
    a, b, m_indices = contiguous_inputs(counts, n, k, gen, "cuda", row_pad=row_pad)
    pad = padding_rows(m_indices=m_indices, num_experts=len(counts))
    a_nan, a_zero = with_padding(a, pad, nan=True), with_padding(a, pad, nan=False)
    d = run_contiguous(a_nan, b, m_indices, n, hint, row_pad)
    ref = poisoned_d(d.shape, "cuda")
    gg.grouped_gemm_torch(a_nan, b, ref, m_indices=m_indices)
    torch.cuda.synchronize()
    compare(d, ref, pad)
    d_zero = run_contiguous(a_zero, b, m_indices, n, hint, row_pad)
    assert torch.equal(d.view(torch.int16), d_zero.view(torch.int16)), "padding rows changed valid rows"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "expected_m, counts, max_m, n, k",
    [
        (1, [1, 0, 1, 2, 0, 1, 3, 1], 64, 384, 512),
        (16, [16, 0, 1, 48, 17, 15], 48, 256, 1024),
        (200, [200, 0, 300, 129, 400], 300, 384, 512),  # 400 > max_m: clamped
        (16, [5, 0, 21], 21, 200, 256),  # max_m and N not multiples of the tile
    ],
)
def test_masked(expected_m, counts, max_m, n, k, gen):
    a, b, masked_m = masked_inputs(counts, max_m, n, k, gen, "cuda")
    pad = padding_rows(masked_m=masked_m, max_m=max_m)
    a_nan, a_zero = with_padding(a, pad, nan=True), with_padding(a, pad, nan=False)
    ref = poisoned_d((len(counts), max_m, n), "cuda")
    gg.grouped_gemm_torch(a_nan, b, ref, masked_m=masked_m)
    for hint in (expected_m, 1, 64, 1000):  # any hint computes the same products
        d = run_masked(a_nan, b, masked_m, n, hint)
        torch.cuda.synchronize()
        compare(d, ref, pad)
        d_zero = run_masked(a_zero, b, masked_m, n, hint)
        assert torch.equal(d.view(torch.int16), d_zero.view(torch.int16)), "masked rows changed valid rows"


@pytest.mark.gpu
@pytest.mark.parametrize("n, k", [(4096, 7168), (7168, 2048)])  # DeepSeek-V3's gate_up and down
def test_deepseek_shapes(n, k, gen):
    a, b, masked_m = masked_inputs([1, 0, 3, 16, 0, 0, 2, 1], 32, n, k, gen, "cuda")
    pad = padding_rows(masked_m=masked_m, max_m=32)
    ref = poisoned_d((8, 32, n), "cuda")
    gg.grouped_gemm_torch(a, b, ref, masked_m=masked_m)
    compare(run_masked(a, b, masked_m, n, 2), ref, pad)

    a, b, m_indices = contiguous_inputs([1, 0, 300, 5], n, k, gen, "cuda", extra_rows=128)
    pad = padding_rows(m_indices=m_indices, num_experts=4)
    ref = poisoned_d((m_indices.numel(), n), "cuda")
    gg.grouped_gemm_torch(a, b, ref, m_indices=m_indices)
    for hint in (None, 128):
        compare(run_contiguous(a, b, m_indices, n, hint), ref, pad)


def capture(fn) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles the kernel) outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@pytest.mark.gpu
def test_cuda_graphs(gen):
    n, k, max_m = 256, 512, 40
    # Masked: new rows and new masked_m between replays
    (a_q, a_s), b, masked_m = masked_inputs([3, 0, 40, 17], max_m, n, k, gen, "cuda")
    d = poisoned_d((4, max_m, n), "cuda")
    graph = capture(lambda: gg.grouped_gemm_masked((a_q, a_s), b, d, masked_m, 16))
    for counts in ([1, 2, 0, 40], [0, 0, 0, 0], [40, 40, 40, 7]):
        new, _, _ = masked_inputs(counts, max_m, n, k, gen, "cuda")
        a_q.copy_(new[0])
        a_s.copy_(new[1])
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        d.view(torch.int16).fill_(BF16_POISON)
        graph.replay()
        want = run_masked((a_q, a_s), b, masked_m, n, 16)
        torch.cuda.synchronize()
        assert torch.equal(d.view(torch.int16), want.view(torch.int16))
        ref = poisoned_d(d.shape, "cuda")
        gg.grouped_gemm_torch((a_q, a_s), b, ref, masked_m=masked_m)
        compare(d, ref, padding_rows(masked_m=masked_m, max_m=max_m))

    # Contiguous: a new routing (other segment sizes, same M) between replays
    a, b, m_indices = contiguous_inputs([5, 130, 0, 1], n, k, gen, "cuda")
    d = poisoned_d((m_indices.numel(), n), "cuda")
    graph = capture(lambda: gg.grouped_gemm_contiguous(a, b, d, m_indices))
    for counts in ([1, 1, 1, 1], [300, 0, 0, 0], [0, 0, 0, 0]):
        ids = segments(counts, 0)
        ids = torch.cat([ids, torch.full((m_indices.numel() - ids.numel(),), -1, dtype=torch.int32)])
        m_indices.copy_(ids)
        x = torch.randn(a[0].shape, generator=gen, device="cuda")
        q, s = reference.per_token_group_quant(x, 128, scale_layout="mn_tma")
        a[0].copy_(q)
        a[1].copy_(s)
        d.view(torch.int16).fill_(BF16_POISON)
        graph.replay()
        want = run_contiguous(a, b, m_indices, n, None)
        torch.cuda.synchronize()
        assert torch.equal(d.view(torch.int16), want.view(torch.int16))
        ref = poisoned_d(d.shape, "cuda")
        gg.grouped_gemm_torch(a, b, ref, m_indices=m_indices)
        compare(d, ref, padding_rows(m_indices=m_indices, num_experts=4))
