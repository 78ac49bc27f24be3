"""``python -m fp8quant bench``: time per_token_group_quant against memory bandwidth and PyTorch.

Timing method on a GPU, per shape:

- R rotating sets of ``(x, q, scale)`` buffers, together at least 256 MiB (R >= 2), so that the
  H200's 60 MB L2 cannot keep a set warm from one call to the next; R is capped at 512, so the
  smallest shapes (a few rows) do run from L2, as they would after the layer that wrote x;
- one CUDA graph of N calls cycling through the sets (N a multiple of R, about 1 ms of work, 20 to
  2048 calls), so that Python and launch overhead are left out as in a captured model;
- time per call = median over 10 replays of (replay time / N), measured with CUDA events.

GB/s counts x read, q written and the whole scale buffer written (padding included); "% copy"
compares it with the device-to-device bandwidth of ``dst.copy_(src)`` on 1 GiB (read + write).
The baselines, a plain fp32 PyTorch implementation and its ``torch.compile``, are timed the same
way, beside PyTorch's elementwise cast of x to float8 (the same bytes as q, no scales: what a
plain memory-bound kernel of the shape's traffic reaches). Without a CUDA GPU the PyTorch
reference is timed on the CPU instead, by wall clock.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from . import __version__, reference
from ._checks import FP8_DTYPE, GROUP_SIZES
from .layouts import SCALE_FORMATS as FORMATS, empty_scale, scale_spec
from .quant import per_token_group_quant

__all__ = ["DESCRIPTION", "MODE_OPTIONS", "add_arguments", "epilog", "main", "torch_quant"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Shapes: every power-of-two M at DeepSeek-V3's hidden size, and a few M at other K.
K_MAIN = 7168
M_MAIN = tuple(1 << i for i in range(16))  # 1 .. 32768
K_OTHER = (2048, 16384, 18432)
M_OTHER = (1, 128, 4096, 32768)
M_QUICK = (1, 128, 2048, 4096, 32768)
M_QUICK_OTHER = 4096
M_BASELINE = (1, 128, 4096, 32768)  # the shapes (at K_MAIN) where baselines run by default


ROTATION_BYTES = 256 << 20  # over four times the H200's L2
MAX_SETS = 512
MIN_CALLS, MAX_CALLS = 20, 2048
GRAPH_TARGET_US = 1000.0  # work per graph replay
CALL_FLOOR_US = 2.0  # the least a call is taken to cost when sizing a graph: bounds tiny shapes' graphs
WARMUP_CALLS = 3
REPLAYS = 10
COPY_BYTES = 1 << 30
COPY_CALLS = 5
INPUT_STD = 4.0  # spread of the random input; any nonzero input costs the kernels the same

# CPU fallback: the float64 reference is slow, so a few small shapes only.
M_CPU = (1, 128, 1024)
M_CPU_QUICK = (1, 128)
LAYOUTS_CPU = ("row", "mn_tma")  # the formats timed on the CPU unless --formats names others
RUNS_CPU = 3

#: The options of ``python -m fp8quant bench`` besides the mode, --json and --markdown (every
#: mode writes those), by attribute name.
OPTIONS = ("quick", "m", "k", "formats", "dtype", "group_size", "baselines", "rotation_mib", "layers")
#: The modes, one a run (None: the default, per_token_group_quant), and the options each takes:
#: main() refuses any other, and --help prints this table.
MODE_OPTIONS = {
    None: OPTIONS,
    "host_overhead": ("m", "k", "formats", "dtype"),
    "weights": ("m", "k", "dtype", "rotation_mib"),
    "gemm": ("m",),
    "moe": ("m", "k", "rotation_mib"),
    "norm": ("m", "k", "dtype", "rotation_mib"),
    "model": ("quick", "m", "layers"),
}
CPU_OPTIONS = ("quick", "m", "k", "formats", "dtype", "group_size")  # the default mode without a GPU


def format_name(layout: str, ue8m0: bool) -> str:
    """``"mn_tma+ue8m0"`` for UE8M0-rounded fp32 scales; packed_ue8m0 is UE8M0 by name."""
    return f"{layout}+ue8m0" if ue8m0 and layout != "packed_ue8m0" else layout


def bench_shapes(quick: bool, ms: list[int] | None = None, k: int | None = None) -> list[tuple[int, int]]:
    """The ``(M, K)`` shapes to time on the GPU: ``ms`` (--m) at ``k`` (--k, default K_MAIN);
    without ``ms``, the default M values (fewer with ``quick``) at ``k``, or without ``k`` either,
    at K_MAIN and a few M at other K."""
    if ms:
        return [(m, k or K_MAIN) for m in ms]
    if k is not None:
        return [(m, k) for m in (M_QUICK if quick else M_MAIN)]
    if quick:
        return [(m, K_MAIN) for m in M_QUICK] + [(M_QUICK_OTHER, k) for k in K_OTHER]
    return [(m, K_MAIN) for m in M_MAIN] + [(m, k) for k in K_OTHER for m in M_OTHER]


def cpu_shapes(quick: bool, ms: list[int] | None = None, k: int | None = None) -> list[tuple[int, int]]:
    """The ``(M, K)`` shapes the CPU fallback times: ``ms`` (--m), or M_CPU (M_CPU_QUICK with
    ``quick``), at ``k`` (--k, default K_MAIN)."""
    return [(m, k or K_MAIN) for m in ms or (M_CPU_QUICK if quick else M_CPU)]


def baseline_shapes(which: str, shapes: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """The shapes among ``shapes`` where the PyTorch baselines run (``--baselines``)."""
    if which == "all":
        return set(shapes)
    if which == "none":
        return set()
    return {(m, K_MAIN) for m in M_BASELINE} & set(shapes)


def format_names() -> list[str]:
    """Every scale format's bench name, in SCALE_FORMATS order."""
    return [format_name(layout, ue8m0) for layout, ue8m0 in FORMATS]


def parse_list(text: str, option: str, convert: Callable[[str], object], allowed=None) -> list:
    """A comma-separated option value, each item converted (and checked against ``allowed``)."""
    items = []
    for item in text.split(","):
        try:
            value = convert(item.strip())
        except ValueError:
            raise SystemExit(f"{option}: cannot read {item.strip()!r}") from None
        if allowed is not None and value not in allowed:
            raise SystemExit(f"{option}: {value!r} is not one of {', '.join(map(str, allowed))}")
        items.append(value)
    return items


def traffic_bytes(m: int, k: int, dtype: torch.dtype, scale_numel: int) -> int:
    """Bytes one quantization moves: x read, q written (one byte each), scales written (four)."""
    return m * k * (dtype.itemsize + 1) + 4 * scale_numel


def rotation_sets(set_bytes: int, rotation_bytes: int = ROTATION_BYTES) -> int:
    """How many buffer sets of ``set_bytes`` to rotate through: ``rotation_bytes`` worth, 2 to
    MAX_SETS; a single set when ``rotation_bytes`` is 0 (inputs stay in L2, as right after the
    layer that wrote them)."""
    if rotation_bytes == 0:
        return 1
    return max(2, min(MAX_SETS, math.ceil(rotation_bytes / set_bytes)))


def graph_calls(sets: int, call_us: float) -> int:
    """Calls per CUDA graph: about GRAPH_TARGET_US of work, MIN_CALLS to MAX_CALLS, rounded up to a
    multiple of ``sets`` so that every set is used equally often."""
    want = min(MAX_CALLS, max(MIN_CALLS, math.ceil(GRAPH_TARGET_US / call_us)))
    return sets * math.ceil(want / sets)


def estimated_call_us(set_bytes: int, copy_gbps: float) -> float:
    """A lower bound of one call's time: its traffic at copy bandwidth, or CALL_FLOOR_US."""
    return max(CALL_FLOOR_US, set_bytes / (copy_gbps * 1e3))


def random_input(m: int, k: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Normal input of standard deviation INPUT_STD (never zeros: every group has a real amax)."""
    return torch.randn((m, k), dtype=dtype, device=device).mul_(INPUT_STD)


def torch_quant(x: torch.Tensor, group_size: int, eps: float = 1e-10) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline: per-token-group FP8 quantization in plain fp32 PyTorch, scales column-major.

    Not bit-exact (``/ 448`` may be a reciprocal multiply): a speed reference, not an oracle.
    """
    groups = x.unflatten(-1, (-1, group_size)).float()
    amax = groups.abs().amax(-1).clamp_min(eps)
    scale = amax / reference.FP8_MAX
    q = (groups / scale.unsqueeze(-1)).clamp(-reference.FP8_MAX, reference.FP8_MAX).to(FP8_DTYPE)
    return q.flatten(-2), scale.t().contiguous().t()


@dataclass
class Result:
    """One timed (shape, format or baseline)."""

    m: int
    k: int
    name: str
    time_us: float
    bytes: int
    sets: int  # rotating buffer sets (1 on the CPU)
    calls: int  # calls per timed run (per CUDA graph replay on the GPU)
    gbps: float = field(init=False)

    def __post_init__(self) -> None:
        self.gbps = self.bytes / (self.time_us * 1e3)


@dataclass
class Report:
    """A whole benchmark run: what ran where, and its results."""

    device: str
    dtype: str
    group_size: int
    method: str
    copy_gbps: float | None  # None on the CPU
    results: list[Result] = field(default_factory=list)
    op: str = "per_token_group_quant"
    rows: str = "M"  # what a result's first size counts
    granularity: str = ""  # in the title instead of "group size N" (for instance "128 x 128 blocks")

    def pct_copy(self, result: Result) -> float | None:
        return None if self.copy_gbps is None else 100.0 * result.gbps / self.copy_gbps

    def to_json(self) -> dict:
        meta = {key: value for key, value in asdict(self).items() if key != "results"}
        results = [{**asdict(r), "pct_copy": self.pct_copy(r)} for r in self.results]
        return {"fp8quant_version": __version__, "torch_version": torch.__version__, **meta, "results": results}

    def table(self) -> str:
        """The results, one line each, for the terminal."""
        lines = [f"{self.rows:>6} {'K':>6}  {'format':<14}{'time µs':>10}{'GB/s':>10}{'%copy':>7}"]
        for r in self.results:
            pct = self.pct_copy(r)
            pct_text = "-" if pct is None else f"{pct:.1f}"
            lines.append(f"{r.m:>6} {r.k:>6}  {r.name:<14}{r.time_us:>10.2f}{r.gbps:>10.2f}{pct_text:>7}")
        return "\n".join(lines)

    def markdown(self) -> str:
        """The results as a Markdown section: one row per shape, one column per format."""
        names = list(dict.fromkeys(r.name for r in self.results))
        shapes = list(dict.fromkeys((r.m, r.k) for r in self.results))
        by_key = {(r.m, r.k, r.name): r for r in self.results}
        cell_text = "time per call in µs" + ("" if self.copy_gbps is None else " (% of copy bandwidth)")
        lines = [
            f"### {self.op}: {self.device}, {self.dtype} input, {self.granularity or f'group size {self.group_size}'}",
            "",
            f"fp8quant {__version__}, torch {torch.__version__}. {self.method}",
        ]
        if self.copy_gbps is not None:
            lines.append(f"Device-to-device copy bandwidth: {self.copy_gbps:.0f} GB/s.")
        lines += [
            f"Each cell: {cell_text}.",
            "",
            f"| {self.rows} | K | " + " | ".join(names) + " |",
            "|" + "--:|" * (len(names) + 2),
        ]
        for m, k in shapes:
            cells = [self._markdown_cell(by_key.get((m, k, name))) for name in names]
            lines.append(f"| {m} | {k} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def _markdown_cell(self, result: Result | None) -> str:
        if result is None:
            return "-"
        pct = self.pct_copy(result)
        return f"{result.time_us:.2f}" if pct is None else f"{result.time_us:.2f} ({pct:.0f}%)"


def progress(message: str) -> None:
    """A progress line on stderr (the GPU run takes minutes; stdout holds the results)."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- GPU


def _event_ms(run: Callable[[], object]) -> float:
    """Milliseconds ``run()`` takes on the current stream, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_graph(call: Callable[[int], object], sets: int, calls: int) -> float:
    """Median microseconds per ``call(i)`` in a CUDA graph of ``calls`` calls, ``i`` cycling through
    ``range(sets)``, after a few eager warm-up calls."""
    for i in range(WARMUP_CALLS):
        call(i % sets)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i % sets)
    graph.replay()
    return statistics.median(_event_ms(graph.replay) for _ in range(REPLAYS)) * 1e3 / calls


def fused_and_chain(
    m: int, k: int, names: tuple[str, str], fused, chain, make_set, nbytes: int, set_bytes: int, copy_gbps: float,
    rotation_bytes: int, chain_every: int,
) -> list[Result]:
    """Time ``fused(inputs)`` and the op chain ``chain(inputs)`` over rotated input sets from
    ``make_set()`` (``set_bytes`` each); the chain, several launches a call, runs ``chain_every``
    times fewer calls a graph. The sets are freed on return."""
    sets = [make_set() for _ in range(rotation_sets(set_bytes, rotation_bytes))]
    calls = graph_calls(len(sets), estimated_call_us(nbytes, copy_gbps))
    chain_calls = max(1, calls // chain_every)
    return [
        Result(m, k, names[0], time_graph(lambda i: fused(sets[i]), len(sets), calls), nbytes, len(sets), calls),
        Result(m, k, names[1], time_graph(lambda i: chain(sets[i]), len(sets), chain_calls), nbytes,
                     len(sets), chain_calls),
    ]  # fmt: skip


def copy_bandwidth_gbps(device: torch.device) -> float:
    """Device-to-device bandwidth of ``dst.copy_(src)`` on COPY_BYTES, counting read and write.

    Eager, not in a CUDA graph: captured, the copy becomes a memcpy node, slower than the eager
    copy kernel, which is what a quantizer's traffic compares with. COPY_CALLS back-to-back
    copies per timed run, so that a lone copy's ramp-up and tail do not count.
    """
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(WARMUP_CALLS * COPY_CALLS):  # several GiB copied first: lets the clocks come up
        dst.copy_(src)

    def copies() -> None:
        for _ in range(COPY_CALLS):
            dst.copy_(src)

    ms = statistics.median(_event_ms(copies) for _ in range(REPLAYS)) / COPY_CALLS
    return 2 * COPY_BYTES / (ms * 1e6)


@dataclass
class Workload:
    """One shape's rotating inputs and outputs, and the size of its CUDA graphs."""

    m: int
    k: int
    group_size: int
    xs: list[torch.Tensor]
    qs: list[torch.Tensor]
    calls: int

    @classmethod
    def allocate(
        cls,
        m: int,
        k: int,
        dtype: torch.dtype,
        group_size: int,
        device: torch.device,
        copy_gbps: float,
        rotation_bytes: int = ROTATION_BYTES,
    ) -> Workload:
        """Enough random inputs and q outputs to rotate through, and a graph of about
        GRAPH_TARGET_US at ``copy_gbps``."""
        largest_scale = max(scale_spec(layout, m, k // group_size).numel for layout, _ in FORMATS)
        set_bytes = traffic_bytes(m, k, dtype, largest_scale)
        sets = rotation_sets(set_bytes, rotation_bytes)
        xs = [random_input(m, k, dtype, device) for _ in range(sets)]
        qs = [torch.empty((m, k), dtype=FP8_DTYPE, device=device) for _ in range(sets)]
        return cls(m, k, group_size, xs, qs, graph_calls(sets, estimated_call_us(set_bytes, copy_gbps)))

    @property
    def sets(self) -> int:
        return len(self.xs)

    def result(self, name: str, call: Callable[[int], object], scale_numel: int) -> Result:
        """Time ``call(i)``, which processes set ``i``, into a Result."""
        time_us = time_graph(call, self.sets, self.calls)
        nbytes = traffic_bytes(self.m, self.k, self.xs[0].dtype, scale_numel)
        return Result(self.m, self.k, name, time_us, nbytes, self.sets, self.calls)


def time_format(work: Workload, layout: str, ue8m0: bool) -> Result:
    """fp8quant into preallocated outputs of one scale format."""
    num_groups = work.k // work.group_size
    device = work.xs[0].device
    scales = [empty_scale(layout, work.m, num_groups, device=device) for _ in range(work.sets)]

    def call(i: int) -> None:
        out = (work.qs[i], scales[i])
        per_token_group_quant(work.xs[i], work.group_size, scale_layout=layout, ue8m0=ue8m0, out=out)

    return work.result(format_name(layout, ue8m0), call, scale_spec(layout, work.m, num_groups).numel)


def time_cast(work: Workload) -> Result:
    """PyTorch's elementwise cast of x to float8: the same bytes as q, no scales. Not a quantizer:
    what a plain memory-bound kernel of this shape's traffic achieves."""
    return work.result("torch cast", lambda i: work.qs[i].copy_(work.xs[i]), 0)


def time_baseline(work: Workload, name: str, quant: Callable) -> Result:
    """A PyTorch baseline, which allocates its outputs (fp32 column-major scales)."""
    return work.result(name, lambda i: quant(work.xs[i], work.group_size), work.m * (work.k // work.group_size))


def compile_baseline(work: Workload) -> Callable | None:
    """``torch.compile(torch_quant)`` compiled for this shape, or None (with a warning) if that fails."""
    torch.compiler.reset()  # one static graph per shape: stay clear of Dynamo's recompile limit
    compiled = torch.compile(torch_quant, dynamic=False)
    try:
        compiled(work.xs[0], work.group_size)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any compiler failure just drops this baseline
        progress(f"warning: torch.compile failed, skipping the torch.compile baseline from now on: {exc!r}")
        return None
    return compiled


def method_text(rotation_mib: int) -> str:
    """How the times were taken, for the report: rotated buffers, or one L2-resident set."""
    if rotation_mib == 0:
        inputs = "on one buffer set, so the input stays in L2 (as right after the layer that wrote it)"
    else:
        inputs = f"cycling through rotating buffer sets of at least {rotation_mib} MiB in all (at most {MAX_SETS} sets)"
    return f"Time per call: a CUDA graph of N calls {inputs}, median of {REPLAYS} replays."


def run_gpu(args: argparse.Namespace) -> Report:
    """Copy bandwidth first, then every shape in every format, with the baselines where asked."""
    device = torch.device("cuda", torch.cuda.current_device())
    dtype = DTYPES[args.dtype]
    copy_gbps = copy_bandwidth_gbps(device)
    report = Report(
        device=torch.cuda.get_device_name(device),
        dtype=args.dtype,
        group_size=args.group_size,
        method=method_text(args.rotation_mib),
        copy_gbps=copy_gbps,
    )
    print(f"fp8quant {__version__} bench on {report.device} (torch {torch.__version__}, CUDA {torch.version.cuda})")
    print(f"{args.dtype} input, group size {args.group_size}; copy bandwidth {copy_gbps:.0f} GB/s", flush=True)

    shapes = bench_shapes(args.quick, args.m, args.k if "k" in args.given else None)
    with_baselines = baseline_shapes(args.baselines, shapes)
    formats = [(layout, ue8m0) for layout, ue8m0 in FORMATS if format_name(layout, ue8m0) in args.formats]
    use_compile = True
    for index, (m, k) in enumerate(shapes, 1):
        work = Workload.allocate(m, k, dtype, args.group_size, device, copy_gbps, args.rotation_mib << 20)
        progress(f"[{index}/{len(shapes)}] M={m} K={k}: {work.sets} buffer sets, {work.calls} calls per graph")
        report.results += [time_format(work, layout, ue8m0) for layout, ue8m0 in formats]
        if (m, k) in with_baselines:
            report.results.append(time_cast(work))
            report.results.append(time_baseline(work, "torch eager", torch_quant))
            compiled = compile_baseline(work) if use_compile else None
            use_compile = compiled is not None
            if compiled is not None:
                report.results.append(time_baseline(work, "torch.compile", compiled))
        del work
        torch.cuda.empty_cache()
    return report


# --------------------------------------------------------------------------------------------- CPU


def wall_us(run: Callable[[], object]) -> float:
    """Median wall-clock microseconds of ``run()`` over RUNS_CPU runs, after one warm-up run."""
    run()
    times = []
    for _ in range(RUNS_CPU):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def run_cpu(args: argparse.Namespace) -> Report:
    """The PyTorch reference on a few small shapes (``cpu_shapes``: --quick, --m, --k) in
    LAYOUTS_CPU or the --formats named, for machines without a CUDA GPU."""
    print("No CUDA GPU found: benchmarking the PyTorch reference (fp8quant.reference) on the CPU instead.")
    dtype = DTYPES[args.dtype]
    report = Report(
        device="CPU",
        dtype=args.dtype,
        group_size=args.group_size,
        method=f"fp8quant.reference on the CPU, median wall clock of {RUNS_CPU} runs.",
        copy_gbps=None,
    )
    names = args.formats if "formats" in args.given else LAYOUTS_CPU
    formats = [(layout, ue8m0) for layout, ue8m0 in FORMATS if format_name(layout, ue8m0) in names]
    for m, k in cpu_shapes(args.quick, args.m, args.k if "k" in args.given else None):
        x = random_input(m, k, dtype, "cpu")
        for layout, ue8m0 in formats:
            run = functools.partial(
                reference.per_token_group_quant, x, args.group_size, scale_layout=layout, ue8m0=ue8m0
            )
            nbytes = traffic_bytes(m, k, dtype, scale_spec(layout, m, k // args.group_size).numel)
            report.results.append(Result(m, k, format_name(layout, ue8m0), wall_us(run), nbytes, sets=1, calls=1))
    return report


# --------------------------------------------------------------------------------------------- CLI


DESCRIPTION = f"""\
Time fp8quant's kernels on a CUDA GPU: device time per call (the median of {REPLAYS} replays of a
CUDA graph of N calls), against the device-to-device copy bandwidth and beside what each op
replaces. One mode a run:

  (default)        per_token_group_quant in every scale format, beside PyTorch eager,
                   torch.compile and a cast of x to float8
  --host-overhead  host time per eager call, beside torch's own ops
  --weights        per_block_quant and requantize_ue8m0 on DeepSeek-V3's weight shapes
  --gemm           the block-scaled FP8 GEMMs fp8quant.linear runs, beside a bf16 matmul
  --moe            a DeepSeek-V3 MoE layer and its ops, beside the engines' Triton chain
  --norm           residual add + RMSNorm + group quantization, beside the unfused pair
  --model NAME     a transformers model (deepseek-v3, qwen3-moe) in FP8 on fp8quant, beside
                   bf16: prefill, decode steps, logits accuracy

Without a CUDA GPU the default mode times the PyTorch reference (fp8quant.reference) on the
CPU by wall clock, on a few small shapes; --model runs tiny dims there; the other modes need
the GPU."""


def flag(name: str | None) -> str:
    """The command-line spelling of an option or mode attribute (None: the default mode)."""
    return "(default)" if name is None else "--" + name.replace("_", "-")


def epilog() -> str:
    """The table of the options each mode takes (MODE_OPTIONS), for --help."""
    rows = [(flag(mode), options) for mode, options in MODE_OPTIONS.items()]
    rows.insert(1, ("(default, no GPU)", CPU_OPTIONS))
    width = max(len(name) for name, _ in rows) + 2
    lines = [f"  {name:<{width}}{' '.join(map(flag, options))}" for name, options in rows]
    return "options each mode takes (any other is refused; --json and --markdown: every mode):\n" + "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's options (its description and epilog: DESCRIPTION, epilog())."""
    modes = parser.add_argument_group("mode (one at a time; default: per_token_group_quant)")
    mode = modes.add_mutually_exclusive_group()
    mode.add_argument(
        "--host-overhead",
        action="store_true",
        help="host time per eager call of per_token_group_quant (allocating and out=) and rms_norm_quant at one M "
        "(default 1), beside torch's cast to float8 and other eager ops; scale layout mn_tma unless --formats "
        "names another",
    )
    mode.add_argument(
        "--weights",
        action="store_true",
        help="per_block_quant (fp32 and UE8M0 scales) and requantize_ue8m0 on DeepSeek-V3's weight shapes (or N "
        "from --m at K from --k), against the copy bandwidth, beside torch's cast",
    )
    mode.add_argument(
        "--gemm",
        action="store_true",
        help="block-scaled FP8 GEMMs (torch._scaled_mm on SM90, DeepGEMM if installed) against a bf16 matmul on "
        "DeepSeek-V3's weight shapes, with the activation quantization's share (M from --m)",
    )
    mode.add_argument(
        "--moe",
        action="store_true",
        help="a DeepSeek-V3 MoE layer (k = 8 of 256 experts, I = 2048, bf16; H from --k) and its ops at T from --m "
        "(default 1 to 16384), static bounds, beside the engines' Triton chain around the same GEMMs, against the "
        "weight-read floor and the copy bandwidth",
    )
    mode.add_argument(
        "--model",
        choices=("deepseek-v3", "qwen3-moe"),
        help="a transformers model of the real per-layer dims with random weights (--layers, default 4), FP8 on "
        "fp8quant (fp8quant.integrations.transformers) against bf16: prefill at T from --m (default 512, 2048, "
        "8192), decode steps at batch 1, 8, 64 (static cache, CUDA graphs), logits calc_diff beside the format's "
        "floor; without a GPU, tiny dims on the CPU",
    )
    mode.add_argument(
        "--norm",
        action="store_true",
        help="residual add + RMSNorm + group quantization (rms_norm_quant, mn_tma scales; M from --m, default 1 to "
        "16384; H from --k) against the copy bandwidth, the unfused pair and torch.compile of the reference",
    )

    shapes = parser.add_argument_group("shapes")
    shapes.add_argument(
        "--quick",
        action="store_true",
        help=f"fewer shapes: M in {', '.join(map(str, M_QUICK))} at K = {K_MAIN} and M = {M_QUICK_OTHER} at K in "
        f"{', '.join(map(str, K_OTHER))} (with --k: those M at that K; on the CPU: M in "
        f"{', '.join(map(str, M_CPU_QUICK))})",
    )
    shapes.add_argument(
        "--m",
        metavar="M[,M...]",
        help="the first size of each shape: M (default mode, --norm; --host-overhead: one M, default 1), N "
        "(--weights), M of the GEMMs (--gemm), T tokens (--moe); default: each mode's own list",
    )
    shapes.add_argument(
        "--layers",
        type=int,
        metavar="N",
        help="decoder layers of --model (default 4: the first dense, the others MoE; 2 on the CPU)",
    )
    shapes.add_argument(
        "--k",
        type=int,
        help=f"the second size: K (default mode, --host-overhead, --weights) or H (--moe, --norm), a multiple of "
        f"--group-size; default {K_MAIN} (the default mode also times K in {', '.join(map(str, K_OTHER))} without "
        "--k and --m; --weights times DeepSeek-V3's (N, K) pairs without either; --gemm's shapes are fixed)",
    )

    inputs = parser.add_argument_group("input and scales")
    inputs.add_argument(
        "--dtype", choices=tuple(DTYPES), help="input dtype (default: bf16; --norm: bf16 or fp16)"
    )
    inputs.add_argument(
        "--formats",
        metavar="NAME[,NAME...]",
        help="scale formats (default mode; default: all of " + ", ".join(format_names()) + "; on the CPU: "
        + ", ".join(LAYOUTS_CPU) + "); --host-overhead: one scale layout (default mn_tma)",
    )
    inputs.add_argument(
        "--group-size", type=int, choices=GROUP_SIZES, help="elements per group (default mode; default: 128)"
    )

    timing = parser.add_argument_group("timing")
    timing.add_argument(
        "--baselines",
        choices=("all", "default", "none"),
        help="shapes to time the PyTorch eager, torch.compile and cast baselines at (default mode): every shape, "
        f"M in {M_BASELINE} at K={K_MAIN} (default), or none",
    )
    timing.add_argument(
        "--rotation-mib",
        type=int,
        metavar="N",
        help=f"rotate through at least N MiB of buffers (default {ROTATION_BYTES >> 20}: L2 cannot help); 0 times "
        "one buffer set, which stays in L2 (default mode, --weights, --moe, --norm)",
    )

    output = parser.add_argument_group("output")
    output.add_argument("--json", metavar="PATH", help="also write every result as JSON to PATH")
    output.add_argument("--markdown", metavar="PATH", help="also write a Markdown table (for BENCHMARKS.md) to PATH")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark the parsed ``args`` describe, print its table and write its files.

    Options a mode does not take are refused (MODE_OPTIONS); the others get their defaults here,
    and ``args.given`` names those given on the command line."""
    mode = next((name for name in MODE_OPTIONS if name is not None and getattr(args, name)), None)
    cpu = mode is None and not torch.cuda.is_available()
    takes = CPU_OPTIONS if cpu else MODE_OPTIONS[mode]
    values = {name: getattr(args, name) for name in OPTIONS}
    args.given = frozenset(name for name, value in values.items() if value is not None and value is not False)
    if args.rotation_mib is not None and args.rotation_mib < 0:
        raise SystemExit(f"--rotation-mib must be >= 0, got {args.rotation_mib}")
    for name in OPTIONS:
        if name in args.given and name not in takes:
            if cpu:
                raise SystemExit(
                    f"{flag(name)} applies to the GPU run; no CUDA GPU was found, and the CPU run (the reference) "
                    f"takes {', '.join(map(flag, takes))}"
                )
            raise SystemExit(f"{flag(name)} does not apply to {flag(mode)}, which takes "
                             f"{', '.join(map(flag, takes))} (and --json, --markdown)")  # fmt: skip
    names = format_names()
    args.formats = names if args.formats is None else parse_list(args.formats, "--formats", str, names)
    if args.m is not None:
        args.m = parse_list(args.m, "--m", int)
        if min(args.m) < 1:
            raise SystemExit(f"--m: M must be >= 1, got {min(args.m)}")
    args.group_size = args.group_size or 128
    if args.k is not None and (args.k < 1 or args.k % args.group_size):
        raise SystemExit(f"--k must be a positive multiple of --group-size ({args.group_size}), got {args.k}")
    args.k = args.k or K_MAIN
    args.dtype = args.dtype or "bf16"
    args.baselines = args.baselines or "default"
    args.rotation_mib = ROTATION_BYTES >> 20 if args.rotation_mib is None else args.rotation_mib
    if mode == "weights":
        from .bench_weights import run_weights  # noqa: PLC0415 - it imports this module

        return run_weights(args)
    if mode == "gemm":
        from .bench_gemm import run_gemm  # noqa: PLC0415 - it imports this module

        return run_gemm(args)
    if mode == "moe":
        from .bench_moe import run_moe  # noqa: PLC0415 - it imports this module

        return run_moe(args)
    if mode == "norm":
        from .bench_norm import run_norm  # noqa: PLC0415 - it imports this module

        return run_norm(args)
    if mode == "host_overhead":
        from .bench_host import run_host  # noqa: PLC0415 - it imports this module

        return run_host(args)
    if mode == "model":
        from .bench_model import run_model  # noqa: PLC0415

        if args.layers is not None and args.layers < 2:
            raise SystemExit(f"--layers must be >= 2 (the first layer is dense, the others MoE), got {args.layers}")
        return run_model(args)
    return emit(run_cpu(args) if cpu else run_gpu(args), args)


def emit(report: Report, args: argparse.Namespace) -> int:
    """Print the report's table and write the files ``--json`` and ``--markdown`` name."""
    print(report.table(), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=2)
        progress(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(report.markdown())
        progress(f"wrote {args.markdown}")
    return 0


def run_shapes(
    args: argparse.Namespace,
    shapes: list[tuple[int, int]],
    time_shape: Callable[[int, int, torch.dtype, float, int], list[Result]],
    *,
    refusal: str,
    labels: tuple[str, str],
    op: str,
    rows: str,
    granularity: str,
) -> int:
    """A GPU-only mode: ``time_shape(a, b, dtype, copy_gbps, rotation_bytes)`` for each shape
    ``(a, b)`` (progress labelled ``labels``), into one report, emitted as the main mode's.
    Without a GPU: SystemExit with ``refusal``."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{refusal}; no CUDA GPU was found")
    device = torch.device("cuda", torch.cuda.current_device())
    copy_gbps = copy_bandwidth_gbps(device)
    report = Report(
        device=torch.cuda.get_device_name(device), dtype=args.dtype, group_size=128,
        method=method_text(args.rotation_mib), copy_gbps=copy_gbps, op=op, rows=rows, granularity=granularity,
    )  # fmt: skip
    for index, (a, b) in enumerate(shapes, 1):
        progress(f"[{index}/{len(shapes)}] {labels[0]}={a} {labels[1]}={b}")
        report.results += time_shape(a, b, DTYPES[args.dtype], copy_gbps, args.rotation_mib << 20)
        torch.cuda.empty_cache()
    return emit(report, args)
