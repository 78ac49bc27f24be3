"""``python -m fp8quant``: fp8quant's command line.

    python -m fp8quant bench --help
"""

from __future__ import annotations

import argparse
import sys

from . import __version__, bench


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fp8quant",
        description="fp8quant: fused per-token-group FP8 quantization for block-scaled FP8 GEMMs.",
    )
    parser.add_argument("--version", action="version", version=f"fp8quant {__version__}")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    bench_parser = commands.add_parser(
        "bench",
        help="time per_token_group_quant in every scale format against copy bandwidth and PyTorch",
        description=bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(run=bench.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
