"""Plot `python -m fp8quant bench --model ... --json FILE` results: milliseconds against T
(prefill tokens, decode batch), bf16 beside fp8quant, one panel per model.

    python benchmarks/plot_model.py benchmarks/results/model_{deepseek-v3,qwen3-moe}.json -o docs/model_latency.svg
    python benchmarks/plot_model.py benchmarks/results/model_*_h100.json -o docs/model_latency_h100.svg

Needs matplotlib (not a dependency of fp8quant).
"""

from __future__ import annotations

import argparse
import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def series(results: list[dict], kind: str, timed: str | None) -> tuple[list[int], list[float], list[float]]:
    """(T, bf16 ms, fp8quant ms) of the rows whose measurement starts with ``kind`` (and, with
    ``timed``, that were timed so: "eager" or "CUDA graph"); T is the measurement's last number."""
    rows = [(int(re.findall(r"\d+", r["measurement"])[-1]), r["bf16_ms"], r["fp8quant_ms"]) for r in results
            if r["measurement"].startswith(kind) and timed in (None, r.get("timed", "eager"))]  # fmt: skip
    rows.sort()
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="bench --model --json outputs")
    parser.add_argument("-o", "--output", required=True, help="the figure (.svg or .png)")
    args = parser.parse_args()
    runs = [json.load(open(path)) for path in args.json]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.2), squeeze=False)
    for ax, run in zip(axes[0], runs):
        for kind, timed, label, marker in (("prefill", "eager", "prefill, T tokens", "o"),
                                           ("prefill", "CUDA graph", "prefill graph, T tokens", "^"),
                                           ("decode", None, "decode step, batch T", "s")):  # fmt: skip
            t, bf16, fp8 = series(run["results"], kind, timed)
            if not t:
                continue
            ax.plot(t, bf16, marker=marker, linestyle="--", color="tab:gray", label=f"bf16 {label}")
            ax.plot(t, fp8, marker=marker, color="tab:blue", label=f"fp8quant {label}")
            for x, a, b in zip(t, bf16, fp8):
                ax.annotate(f"{a / b:.2f}x", (x, b), textcoords="offset points", xytext=(4, -12), fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T")
        ax.set_ylabel("ms")
        ax.set_title(f"{run['model']}, {run['layers']} layers, {run['device']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
