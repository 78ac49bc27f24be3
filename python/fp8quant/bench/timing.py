"""The timing base every ``python -m fp8quant bench`` mode shares: CUDA-graph replay of N calls
over rotating buffer sets (DRAM; one set stays in L2), the device-to-device copy bandwidth the
results are compared with, the shapes, the Result and Report of a run and their files."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from .. import __version__

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# Shapes: every power-of-two M at DeepSeek-V3's hidden size, and a few M at other K.
K_MAIN = 7168


M_MAIN = tuple(1 << i for i in range(16))  # 1 .. 32768


K_OTHER = (2048, 16384, 18432)


M_OTHER = (1, 128, 4096, 32768)


M_QUICK = (1, 128, 2048, 4096, 32768)


M_QUICK_OTHER = 4096


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
    m: int,
    k: int,
    names: tuple[str, str],
    fused,
    chain,
    make_set,
    nbytes: int,
    set_bytes: int,
    copy_gbps: float,
    rotation_bytes: int,
    chain_every: int,
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


def method_text(rotation_mib: int) -> str:
    """How the times were taken, for the report: rotated buffers, or one L2-resident set."""
    if rotation_mib == 0:
        inputs = "on one buffer set, so the input stays in L2 (as right after the layer that wrote it)"
    else:
        inputs = f"cycling through rotating buffer sets of at least {rotation_mib} MiB in all (at most {MAX_SETS} sets)"
    return f"Time per call: a CUDA graph of N calls {inputs}, median of {REPLAYS} replays."


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
