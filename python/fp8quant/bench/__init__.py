"""``python -m fp8quant bench``: one mode a run, each a module of this package over the shared
timing base (:mod:`fp8quant.bench.timing`): the default (:mod:`~fp8quant.bench.quant`:
per_token_group_quant), ``--host-overhead`` (:mod:`~fp8quant.bench.host`), ``--weights``,
``--gemm``, ``--moe`` (with the engines' chain, :mod:`~fp8quant.bench.engines`), ``--norm``, ``--mx``
and ``--model``. This module is the command line on top: the options, the table of the options
each mode takes, and the dispatch to the mode's ``run_*``."""

from __future__ import annotations

import argparse
import importlib

import torch

from .._checks import GROUP_SIZES
from .quant import LAYOUTS_CPU, M_BASELINE, M_CPU_QUICK, format_names, run_cpu, run_gpu
from .timing import DTYPES, K_MAIN, K_OTHER, M_QUICK, M_QUICK_OTHER, REPLAYS, ROTATION_BYTES, emit, parse_list

#: The modes other than the default one: (module of this package, its run function)
RUNNERS = {
    "weights": ("weights", "run_weights"),
    "gemm": ("gemm", "run_gemm"),
    "moe": ("moe", "run_moe"),
    "norm": ("norm", "run_norm"),
    "mx": ("mx", "run_mx"),
    "host_overhead": ("host", "run_host"),
    "model": ("model", "run_model"),
}

__all__ = ["DESCRIPTION", "MODE_OPTIONS", "OPTIONS", "add_arguments", "epilog", "flag", "main"]


#: The options of ``python -m fp8quant bench`` besides the mode, --json and --markdown (every
#: mode writes those), by attribute name.
OPTIONS = ("quick", "m", "k", "formats", "dtype", "group_size", "baselines", "rotation_mib", "layers")


#: The modes, one a run (None: the default, per_token_group_quant), and the options each takes:
#: main() refuses any other, and --help prints this table.
MODE_OPTIONS = {
    None: ("quick", "m", "k", "formats", "dtype", "group_size", "baselines", "rotation_mib"),
    "host_overhead": ("m", "k", "formats", "dtype"),
    "weights": ("m", "k", "dtype", "rotation_mib"),
    "gemm": ("m",),
    "moe": ("m", "k", "rotation_mib"),
    "norm": ("m", "k", "dtype", "rotation_mib"),
    "mx": ("m", "k", "dtype", "rotation_mib"),
    "model": ("quick", "m", "layers"),
}


CPU_OPTIONS = ("quick", "m", "k", "formats", "dtype", "group_size")  # the default mode without a GPU


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
  --mx             MXFP8 and NVFP4 quantization (Blackwell's block-scaled formats)
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
    mode.add_argument(
        "--mx",
        action="store_true",
        help="MXFP8 (both recipes, swizzled and row scales) and NVFP4 quantization (M from --m, default 1 to 32768; "
        "K from --k) against the copy bandwidth and torch.compile of the reference",
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
    inputs.add_argument("--dtype", choices=tuple(DTYPES), help="input dtype (default: bf16; --norm: bf16 or fp16)")
    inputs.add_argument(
        "--formats",
        metavar="NAME[,NAME...]",
        help="scale formats (default mode; default: all of "
        + ", ".join(format_names())
        + "; on the CPU: "
        + ", ".join(LAYOUTS_CPU)
        + "); --host-overhead: one scale layout (default mn_tma)",
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
    if mode in RUNNERS:  # imported on use: a mode's module may need more than this one
        module, runner = RUNNERS[mode]
        return getattr(importlib.import_module(f".{module}", __package__), runner)(args)
    return emit(run_cpu(args) if cpu else run_gpu(args), args)
