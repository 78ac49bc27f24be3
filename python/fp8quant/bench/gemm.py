"""``python -m fp8quant bench --gemm``: block-scaled FP8 GEMMs on DeepSeek-V3's linear-layer
shapes, for each backend this GPU has, beside a bf16 matmul; and fp8quant's activation
quantization as a share of the layer.

Per (N, K) shape and M (``--m`` picks the M values), for ``torch._scaled_mm`` (SM90: the call
:func:`fp8quant.linear` makes, M padded to 4) and DeepGEMM (when ``deep_gemm`` is importable),
and ``torch.mm`` of the bf16 operands as the baseline:

- device time of the GEMM alone, as the other modes time: a CUDA graph of N calls (about 1 ms of
  work, 20 to 2048 calls), median of 10 replays (``timing.time_graph``);
- TFLOPS (2 M N K) and GB/s (A and W read, their scales read, the bf16 output written; the
  activation scales as allocated, rows padded to 4);
- calc_diff (SPEC.md section 4) against the bf16 product;
- the device time of ``per_token_group_quant`` writing that backend's activation format for this
  M (into preallocated outputs, as ``linear`` does), and its share of quantization + GEMM.

Buffers are not rotated: one weight per shape serves every M and every call, one activation per
M. A GEMM of large M is compute-bound; one of small M streams the weight, and weights of at most
about 40 MB (4096 x 7168, 24576 x 1536 and 32768 x 512 in fp8) can stay in the H200's 60 MB L2
from one call to the next, so their small-M times are partly L2 hits (the bf16 baseline's weights
are twice as large, so less so). Activations and scales are L2-resident throughout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .. import __version__, gemm
from ..layouts import align, empty_scale
from ..quant import per_token_group_quant
from ..recipes import Recipe, recipe
from . import timing
from .weights import SHAPES

__all__ = ["M_VALUES", "SHAPES", "GemmResult", "bf16_bytes", "fp8_bytes", "run_gemm"]

#: The default M values (tokens per GEMM): decode to prefill.
M_VALUES = (1, 16, 64, 128, 512, 1024, 2048, 4096)
BASELINE = "bf16 matmul"


def fp8_bytes(m: int, n: int, k: int) -> int:
    """Bytes an FP8 GEMM moves: A and W (one byte each), the activation scales with rows padded to
    4 and the weight's block scales (fp32), the bf16 output."""
    kb, nb = -(-k // 128), -(-n // 128)
    return m * k + n * k + 4 * (align(m, 4) * kb + nb * kb) + 2 * m * n


def bf16_bytes(m: int, n: int, k: int) -> int:
    """Bytes the bf16 baseline moves: A, W and the output, two bytes each."""
    return 2 * (m * k + n * k + m * n)


@dataclass
class GemmResult:
    """One timed (shape, backend)."""

    m: int
    n: int
    k: int
    backend: str
    time_us: float
    bytes: int
    calls: int  # per CUDA graph replay
    calc_diff: float | None = None  # against the bf16 product; None for the baseline
    quant_us: float | None = None  # the activation's quantization; None for the baseline

    @property
    def tflops(self) -> float:
        return 2 * self.m * self.n * self.k / (self.time_us * 1e6)

    @property
    def gbps(self) -> float:
        return self.bytes / (self.time_us * 1e3)

    @property
    def quant_share(self) -> float | None:
        """Quantization's share of quantization + GEMM, in percent."""
        return None if self.quant_us is None else 100.0 * self.quant_us / (self.quant_us + self.time_us)

    def cells(self) -> list[str]:
        diff = "-" if self.calc_diff is None else f"{self.calc_diff:.1e}"
        quant = "-" if self.quant_us is None else f"{self.quant_us:.2f}"
        share = "-" if self.quant_share is None else f"{self.quant_share:.1f}"
        return [f"{self.time_us:.2f}", f"{self.tflops:.1f}", f"{self.gbps:.0f}", diff, quant, share]


HEADERS = ["GEMM µs", "TFLOPS", "GB/s", "calc_diff", "quant µs", "quant %"]


def table(results: list[GemmResult]) -> str:
    """The results, one line each, for the terminal."""
    widths = [9, 8, 7, 10, 9, 8]
    lines = [f"{'M':>5} {'N':>6} {'K':>6}  {'backend':<12}" + "".join(f"{h:>{w}}" for h, w in zip(HEADERS, widths))]
    for r in results:
        cells = "".join(f"{c:>{w}}" for c, w in zip(r.cells(), widths))
        lines.append(f"{r.m:>5} {r.n:>6} {r.k:>6}  {r.backend:<12}{cells}")
    return "\n".join(lines)


def markdown(results: list[GemmResult], device: str, method: str) -> str:
    """The results as a Markdown section (for BENCHMARKS.md)."""
    lines = [
        f"### Block-scaled FP8 GEMMs: {device}, bf16 activations, 1 x 128 and 128 x 128 scales",
        "",
        f"fp8quant {__version__}, torch {torch.__version__}. {method}",
        "",
        "| M | N | K | backend | " + " | ".join(HEADERS) + " |",
        "|--:|--:|--:|---|" + "--:|" * len(HEADERS),
    ]
    for r in results:
        lines.append(f"| {r.m} | {r.n} | {r.k} | {r.backend} | " + " | ".join(r.cells()) + " |")
    return "\n".join(lines) + "\n"


def graph_calls(call: Callable[[], object]) -> int:
    """Calls per CUDA graph for about timing.GRAPH_TARGET_US of work, from three timed eager calls
    (after the warm-up calls, which also take DeepGEMM's and cuBLASLt's first-call costs)."""
    for _ in range(timing.WARMUP_CALLS):
        call()
    torch.cuda.synchronize()
    us = timing._event_ms(lambda: [call() for _ in range(3)]) * 1e3 / 3
    return timing.graph_calls(1, max(us, timing.CALL_FLOOR_US))


def timed(call: Callable[[], object]) -> tuple[float, int]:
    """(median µs per call in a CUDA graph, calls per graph)."""
    calls = graph_calls(call)
    return timing.time_graph(lambda i: call(), 1, calls), calls


def operands(x: torch.Tensor, w: gemm.QuantizedWeight) -> tuple[Callable[[], object], Callable[[], torch.Tensor]]:
    """(quantize x into preallocated buffers, the GEMM on them) as linear calls them for w's recipe."""
    r: Recipe = w.recipe
    fmt = r.activation
    m, k = x.shape
    g = k // fmt.group_size
    device = x.device
    s = empty_scale(fmt.scale_layout, m, g, device=device)
    if r.backend == "scaled_mm":
        mp = align(m, 4)
        q = torch.zeros((mp, k), dtype=torch.float8_e4m3fn, device=device)  # rows past M stay 0
        s_full = s.as_strided((mp, g), (1, mp))
        out = (q[:m], s)
        return (
            lambda: per_token_group_quant(x, fmt.group_size, scale_layout=fmt.scale_layout, ue8m0=fmt.ue8m0, out=out),
            lambda: gemm._scaled_mm(q, s_full, w, torch.bfloat16)[:m],
        )
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=device)
    xq = gemm.QuantizedActivation(q, s, fmt)
    return (
        lambda: per_token_group_quant(x, fmt.group_size, scale_layout=fmt.scale_layout, ue8m0=fmt.ue8m0, out=(q, s)),
        lambda: gemm._deep_gemm(xq, w, torch.bfloat16),
    )


def gemm_recipes(arch: int) -> list[Recipe]:
    """The backends linear can run on this architecture, DeepGEMM only where importable."""
    out = []
    if arch in (9, 10) and gemm._have_deep_gemm():
        out.append(recipe("deep_gemm", arch))
    if arch == 9:
        out.append(recipe("scaled_mm", 9))
    return out


def time_shape(n: int, k: int, ms: list[int], recipes: list[Recipe], device: torch.device) -> list[GemmResult]:
    """Every M on one weight: the bf16 baseline, then each backend with its quantization."""
    w = timing.random_input(n, k, torch.bfloat16, device)
    prepared = [gemm.prepare_weight(w, r) for r in recipes]
    results = []
    for m in ms:
        x = timing.random_input(m, k, torch.bfloat16, device)
        ref = torch.empty((m, n), dtype=torch.bfloat16, device=device)
        us, calls = timed(lambda: torch.mm(x, w.t(), out=ref))
        results.append(GemmResult(m, n, k, BASELINE, us, bf16_bytes(m, n, k), calls))
        quant_us: dict[str, float] = {}  # by activation format: backends of one format share it
        for wq in prepared:
            quant, run = operands(x, wq)
            quant()
            diff = gemm.calc_diff(run(), ref)
            us, calls = timed(run)
            name = wq.recipe.activation.name
            if name not in quant_us:
                quant_us[name] = timed(quant)[0]
            results.append(GemmResult(m, n, k, wq.recipe.backend, us, fp8_bytes(m, n, k), calls, diff, quant_us[name]))
        timed_now = results[-1 - len(prepared) :]
        timing.progress(f"  M={m}: " + ", ".join(f"{r.backend} {r.time_us:.1f} µs" for r in timed_now))
    return results


def run_gemm(args) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("--gemm times GEMMs on a CUDA GPU; none was found")
    device = torch.device("cuda", torch.cuda.current_device())
    arch = torch.cuda.get_device_capability(device)[0]
    recipes = gemm_recipes(arch)
    name = torch.cuda.get_device_name(device)
    backends = ", ".join(r.name for r in recipes) or "no FP8 backend for this GPU"
    print(f"fp8quant {__version__} GEMM bench on {name} (torch {torch.__version__}, CUDA {torch.version.cuda}): "
          f"{backends} and {BASELINE}", flush=True)  # fmt: skip
    ms = args.m or list(M_VALUES)
    results: list[GemmResult] = []
    for index, (n, k) in enumerate(SHAPES, 1):
        timing.progress(f"[{index}/{len(SHAPES)}] N={n} K={k}")
        results += time_shape(n, k, ms, recipes, device)
        torch.cuda.empty_cache()
    method = (
        f"Time per call: a CUDA graph of N calls on one weight per shape and one activation per M (no buffer "
        f"rotation: weights up to about 40 MB can stay in L2 between calls), median of {timing.REPLAYS} replays."
    )
    print(table(results), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            rows = [{**asdict(r), "tflops": r.tflops, "gbps": r.gbps, "quant_share": r.quant_share} for r in results]
            json.dump({"fp8quant_version": __version__, "torch_version": torch.__version__, "device": name,
                       "method": method, "results": rows}, f, indent=2)  # fmt: skip
        timing.progress(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(results, name, method))
        timing.progress(f"wrote {args.markdown}")
    return 0
