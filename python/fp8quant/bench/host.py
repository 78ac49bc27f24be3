"""``python -m fp8quant bench --host-overhead``: host time per eager call, beside PyTorch's own ops.

Engines run prefill, and often decode, eagerly: there the host time of each call, not the kernel,
is the step's critical path. Each entry below is called back to back CALLS times on the same
small input (M=1 by default, whose kernel is shorter than a call's host time, so the GPU never
holds the host back), then the stream is synchronized, with the garbage collector paused as
timeit does; the time per call is the median of ROUNDS such runs.
Entries run round-robin, so that a drifting clock touches them alike. Every entry works on the
same x and, where it writes, into the same preallocated outputs.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .. import __version__, _ext
from ..layouts import empty_scale
from ..moe import silu_mul_mxfp8
from ..mx import mxfp8_quant, nvfp4_quant
from ..norm import rms_norm_nvfp4, rms_norm_quant
from ..quant import per_token_group_quant
from . import timing

__all__ = ["HostResult", "host_overhead", "run_host"]

CALLS = 2000
ROUNDS = 7
WARMUP = 200


@dataclass
class HostResult:
    name: str
    host_us: float
    ratio: float  # to the baseline, torch's cast of x to float8


def _noop_custom_op() -> Callable:
    """An empty Python ``torch.library.custom_op`` (what dispatch alone costs), made once."""
    name = "fp8quant_bench::noop"
    if not hasattr(_noop_custom_op, "op"):

        @torch.library.custom_op(name, mutates_args=())
        def noop(x: torch.Tensor) -> torch.Tensor:
            return x.new_empty(0)

        @noop.register_fake
        def _(x):
            return x.new_empty(0)

        _noop_custom_op.op = noop
    return _noop_custom_op.op


def entries(m: int, k: int, layout: str, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """The calls to time, by name; the first is the baseline."""
    device = torch.device("cuda", torch.cuda.current_device())
    x = timing.random_input(m, k, dtype, device)
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=device)
    s = empty_scale(layout, m, k // 128, device=device)
    ue8m0 = layout == "packed_ue8m0"
    ext = _ext.extension()
    stream = _ext.raw_stream(device.index)
    raw_args = (x.data_ptr(), _ext.DTYPE_CODES[dtype], 1, m, k, 0, k, q.data_ptr(), 0, k, s.data_ptr(),
                _ext.LAYOUT_CODES[layout], ue8m0, 128, 1e-10, stream)  # fmt: skip
    noop = _noop_custom_op()
    calls = {
        "x.to(float8_e4m3fn)": lambda: x.to(torch.float8_e4m3fn),
        "torch.abs(x)": lambda: torch.abs(x),
        "empty Python custom_op": lambda: noop(x),
        "per_token_group_quant": lambda: per_token_group_quant(x, 128, scale_layout=layout),
        "per_token_group_quant(out=)": lambda: per_token_group_quant(x, 128, scale_layout=layout, out=(q, s)),
        "torch.ops.fp8quant (dispatcher)": lambda: torch.ops.fp8quant.per_token_group_quant(
            x, 128, layout, ue8m0, 1e-10
        ),
        "_C pointers (no checks in Python)": lambda: ext.per_token_group_quant_ptr(*raw_args),
        "_C DLPack tensors": lambda: ext.per_token_group_quant(
            x, q.view(torch.uint8), s, _ext.LAYOUT_CODES[layout], ue8m0, 128, 1e-10, stream
        ),
    }
    if dtype != torch.float32 and k % 16 == 0 and k <= 16384:  # what the RMSNorm kernels take
        weight = torch.ones(k, dtype=dtype, device=device)
        residual = timing.random_input(m, k, dtype, device)
        calls["F.rms_norm(x)"] = lambda: torch.nn.functional.rms_norm(x, (k,), weight, 1e-6)
        calls["rms_norm_quant(residual=)"] = lambda: rms_norm_quant(x, weight, 1e-6, residual=residual,
                                                                    scale_layout=layout)  # fmt: skip
    if k % 64 == 0:  # Blackwell's block-scaled formats (MXFP8 groups of 32; SiLU halves the row)
        encode = torch.tensor(100.0, device=device)
        calls["mxfp8_quant"] = lambda: mxfp8_quant(x)
        calls["nvfp4_quant(global_scale)"] = lambda: nvfp4_quant(x, encode)
        calls["silu_mul_mxfp8"] = lambda: silu_mul_mxfp8(x)
        if dtype != torch.float32 and k <= 16384:
            calls["rms_norm_nvfp4"] = lambda: rms_norm_nvfp4(x, weight, encode)
    return calls


def _time_us(call: Callable[[], object]) -> float:
    """Host microseconds per call, with the garbage collector paused (as timeit does): a
    collection costs whichever call happens to trigger it, by the size of the whole heap."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / CALLS * 1e6
    finally:
        if enabled:
            gc.enable()


def host_overhead(m: int = 1, k: int = timing.K_MAIN, layout: str = "mn_tma",
                  dtype: torch.dtype = torch.bfloat16) -> list[HostResult]:  # fmt: skip
    """Median host microseconds per eager call of each entry, and its ratio to the cast."""
    calls = entries(m, k, layout, dtype)
    for call in calls.values():
        for _ in range(WARMUP):
            call()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            samples[name].append(_time_us(call))
    medians = {name: statistics.median(times) for name, times in samples.items()}
    base = next(iter(medians.values()))
    return [HostResult(name, us, us / base) for name, us in medians.items()]


def run_host(args) -> int:
    """The ``--host-overhead`` mode: print (and write) the table, at one M (--m, default 1) and
    one scale layout (--formats, default mn_tma)."""
    if args.m is not None and len(args.m) > 1:
        raise SystemExit(f"--host-overhead times one M, got --m {','.join(map(str, args.m))}")
    layouts = ("row", "mn", "mn_tma", "packed_ue8m0")
    if "formats" in args.given and (len(args.formats) != 1 or args.formats[0] not in layouts):
        raise SystemExit(f"--host-overhead times one scale layout: --formats takes one of {', '.join(layouts)}")
    if not torch.cuda.is_available():
        raise SystemExit("--host-overhead times eager calls on a CUDA GPU; none was found")
    m = args.m[0] if args.m else 1
    layout = args.formats[0] if "formats" in args.given else "mn_tma"
    results = host_overhead(m, args.k, layout, timing.DTYPES[args.dtype])
    device = torch.cuda.get_device_name()
    lines = [
        f"### Host time per eager call: {device}, M={m}, K={args.k}, {args.dtype}, scale_layout={layout!r}",
        "",
        f"torch {torch.__version__}. {CALLS} calls back to back, then a synchronize, garbage collector paused; "
        f"median of {ROUNDS} rounds.",
        "",
        "| call | host µs | × cast |",
        "|---|--:|--:|",
    ] + [f"| {r.name} | {r.host_us:.1f} | {r.ratio:.2f} |" for r in results]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"fp8quant_version": __version__, "torch_version": torch.__version__, "device": device, "m": m,
                       "k": args.k, "dtype": args.dtype, "scale_layout": layout, "calls": CALLS, "rounds": ROUNDS,
                       "results": [asdict(r) for r in results]}, f, indent=2)  # fmt: skip
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 0
