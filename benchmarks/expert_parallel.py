"""Expert parallelism on DeepSeek-V3's MoE layer (H = 7168, 256 experts, top-8, intermediate 2048,
bf16 tokens, fp8quant.bench.moe's random router): the bytes on the wire and the time per layer
with the tokens sent as bf16 and as FP8 + scales (docs/expert_parallel.md), T tokens on every rank.

    torchrun --nproc-per-node 8 benchmarks/expert_parallel.py               # GPUs, NCCL
    torchrun --nproc-per-node 2 benchmarks/expert_parallel.py --dry-run     # CPU, gloo: bytes only

For each T, mode and wire: the bytes the dispatch and the combine put on the wire (to other ranks,
summed over the ranks, as the handles count them: the rows the routing sends), and on GPUs the
time of the exchange alone (dispatch + combine around experts that compute nothing) and of the
whole layer (``ep_moe_layer``, local GEMMs on ``backend="auto"``): in the low-latency mode the median
over CUDA-graph replays (fp8quant.bench.timing.time_graph: nothing is read back to the host),
in the normal mode (which reads the counts back) the median of CUDA-event-timed eager calls, each
after a barrier; the slowest rank's. The low-latency mode runs up to T = --low-latency-max-t (its
buffers hold world x T rows per peer and expert). ``--dry-run`` runs the exchange on CPU tensors
over gloo and prints the bytes only (no GEMMs, no times).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist

from fp8quant.bench import timing
from fp8quant.bench.moe import EXPERTS, INTERMEDIATE, expert_weights, routed_tokens
from fp8quant.expert_parallel import MODES, ep_combine, ep_dispatch, ep_moe_layer

TOKENS = (16, 128, 4096)
LOW_LATENCY_MAX_T = 1024
EAGER_CALLS = 20  # timed eager calls of the normal mode
GRAPH_CALLS = 10  # calls per CUDA graph of the low-latency mode


def layout_for(mode: str, dry_run: bool) -> str:
    """The layer's layout for the mode; the dry run's CPU tensors take the contiguous one (the
    masked layout's bound of world x T rows per expert is all written on the CPU)."""
    return "masked" if mode == "low_latency" and not dry_run else "contiguous"


def exchange(x, ids, weights, mode: str, wire: str, layout: str):
    """Dispatch and combine around experts that compute nothing: ``(handle, y)``."""
    bound = x.shape[0] if mode == "low_latency" else None
    sent = ep_dispatch(x, ids, EXPERTS, mode=mode, layout=layout, max_tokens_per_rank=bound, wire=wire)
    y = torch.empty((*sent.q.shape[:-1], x.shape[1]), dtype=torch.bfloat16, device=x.device)
    ep_combine(y, sent.handle, weights)
    return sent.handle, y


def all_ranks(values: list[float], op: dist.ReduceOp, device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def eager_us(call: Callable[[], object]) -> float:
    """Median microseconds of EAGER_CALLS calls timed by CUDA events, each after a barrier."""
    call()
    times = []
    for _ in range(EAGER_CALLS):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_us(call: Callable[[], object], mode: str) -> float:
    if mode == "low_latency":
        return timing.time_graph(lambda i: call(), 1, GRAPH_CALLS)
    return eager_us(call)


def measure(x, ids, router, mode: str, wire: str, weights) -> tuple[list[float], list[str]]:
    """The bytes (dispatch, combine) all ranks send, and the times (exchange, layer) of the slowest
    rank ("-" without weights: the dry run)."""
    layout = layout_for(mode, weights is None)
    handle, y = exchange(x, ids, router, mode, wire, layout)
    sent = all_ranks([handle.dispatch_bytes, handle.combine_bytes(y)], dist.ReduceOp.SUM, x.device)
    if weights is None:
        return sent, ["-", "-"]
    bound = x.shape[0] if mode == "low_latency" else None
    us = [
        time_us(lambda: exchange(x, ids, router, mode, wire, layout), mode),
        time_us(lambda: ep_moe_layer(x, ids, router, *weights, mode=mode, max_tokens_per_rank=bound, wire=wire), mode),
    ]
    return sent, [f"{v:.1f}" for v in all_ranks(us, dist.ReduceOp.MAX, x.device)]


def run(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu") if args.dry_run else torch.device("cuda", torch.cuda.current_device())
    h, local = timing.K_MAIN, EXPERTS // world
    weights = None
    if not args.dry_run:
        gen = torch.Generator(device=device).manual_seed(rank)
        weights = (
            expert_weights(local, 2 * INTERMEDIATE, h, device, gen),
            expert_weights(local, h, INTERMEDIATE, device, gen),
        )
    if rank == 0:
        print(f"world {world}, H {h}, {EXPERTS} experts ({local} a rank), top-8, intermediate {INTERMEDIATE}; "
              "bytes to other ranks, all ranks; times: the slowest rank's median")  # fmt: skip
        print(f"{'T':>6} {'mode':<12} {'wire':<5} {'dispatch MiB':>13} {'combine MiB':>12} {'fp8/bf16':>9}"
              f" {'exchange us':>12} {'layer us':>10}")  # fmt: skip
    for t in args.tokens:
        gen = torch.Generator(device=device).manual_seed(1000 * rank + t)
        x, ids, router = routed_tokens(t, h, device, gen)
        for mode in args.modes:
            if mode == "low_latency" and t > args.low_latency_max_t:
                continue
            bf16_bytes = None
            for wire in ("bf16", "fp8"):
                sent, times = measure(x, ids, router, mode, wire, weights)
                bf16_bytes = bf16_bytes or sent[0]
                ratio = f"{sent[0] / bf16_bytes:.3f}" if wire == "fp8" else ""
                if rank == 0:
                    print(f"{t:>6} {mode:<12} {wire:<5} {sent[0] / 2**20:>13.3f} {sent[1] / 2**20:>12.3f} {ratio:>9}"
                          f" {times[0]:>12} {times[1]:>10}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="T per rank, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help="normal, low_latency")
    parser.add_argument("--low-latency-max-t", type=int, default=LOW_LATENCY_MAX_T)
    parser.add_argument("--dry-run", action="store_true", help="CPU tensors over gloo: the bytes, no times")
    args = parser.parse_args()
    args.tokens = timing.parse_list(args.tokens, "--tokens", int)
    args.modes = timing.parse_list(args.modes, "--modes", str, MODES)
    if "RANK" not in os.environ:
        raise SystemExit(
            "run under torchrun (e.g. torchrun --nproc-per-node 2 benchmarks/expert_parallel.py --dry-run)"
        )
    if not args.dry_run:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo" if args.dry_run else "nccl")
    try:
        run(args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
