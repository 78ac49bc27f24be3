"""``python -m fp8quant``: fp8quant's command line. Usage::

    python -m fp8quant bench --help
    python -m fp8quant --cmake-dir      # for find_package(fp8quant CONFIG) in a C++ project

``python -m fp8quant --help`` lists the rest.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__, _install, bench


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fp8quant",
        description="fp8quant: fused per-token-group FP8 quantization for block-scaled FP8 GEMMs.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and the CUDA it was built with")
    locations = parser.add_mutually_exclusive_group()
    locations.add_argument(
        "--cmake-dir", action="store_true", help="print the folder of fp8quantConfig.cmake (for fp8quant_DIR)"
    )
    locations.add_argument("--include-dir", action="store_true", help="print the folder of the C headers")
    locations.add_argument("--library-path", action="store_true", help="print the path of libfp8quant.so")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    bench_parser = commands.add_parser(
        "bench",
        help="time fp8quant's kernels: per_token_group_quant (default), or --host-overhead, --weights, --gemm, "
        "--moe, --norm, --mx, --model",
        description=bench.DESCRIPTION,
        epilog=bench.epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(run=bench.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        try:
            major, minor = _install.cuda_version()
            built = f" (CUDA {major}.{minor})"
        except RuntimeError:
            built = " (no CUDA extension: reference only)"
        print(f"fp8quant {__version__}{built}")
        return 0
    for flag, where in (
        ("cmake_dir", _install.cmake_dir),
        ("include_dir", _install.include_dir),
        ("library_path", _install.library_path),
    ):
        if getattr(args, flag):
            try:
                print(where())
            except FileNotFoundError as exc:
                raise SystemExit(f"error: {exc}") from None
            return 0
    if args.command is None:
        parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
