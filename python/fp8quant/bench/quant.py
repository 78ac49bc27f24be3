"""The default mode of ``python -m fp8quant bench``: time per_token_group_quant against memory bandwidth and PyTorch.

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
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import __version__, reference
from .._checks import FP8_DTYPE
from ..layouts import SCALE_FORMATS as FORMATS
from ..layouts import empty_scale, scale_spec
from ..quant import per_token_group_quant
from .timing import (
    DTYPES,
    K_MAIN,
    ROTATION_BYTES,
    Report,
    Result,
    bench_shapes,
    copy_bandwidth_gbps,
    estimated_call_us,
    graph_calls,
    method_text,
    progress,
    random_input,
    rotation_sets,
    time_graph,
)

M_BASELINE = (1, 128, 4096, 32768)  # the shapes (at K_MAIN) where baselines run by default


# CPU fallback: the float64 reference is slow, so a few small shapes only.
M_CPU = (1, 128, 1024)


M_CPU_QUICK = (1, 128)


LAYOUTS_CPU = ("row", "mn_tma")  # the formats timed on the CPU unless --formats names others


RUNS_CPU = 3


def format_name(layout: str, ue8m0: bool) -> str:
    """``"mn_tma+ue8m0"`` for UE8M0-rounded fp32 scales; packed_ue8m0 is UE8M0 by name."""
    return f"{layout}+ue8m0" if ue8m0 and layout != "packed_ue8m0" else layout


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


def traffic_bytes(m: int, k: int, dtype: torch.dtype, scale_numel: int) -> int:
    """Bytes one quantization moves: x read, q written (one byte each), scales written (four)."""
    return m * k * (dtype.itemsize + 1) + 4 * scale_numel


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
    except Exception as exc:
        progress(f"warning: torch.compile failed, skipping the torch.compile baseline from now on: {exc!r}")
        return None
    return compiled


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
