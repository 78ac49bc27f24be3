"""Time the MoE and NVFP4 ops of whichever fp8quant is imported, for A/B runs of two builds in one
session (install the other with ``pip install --no-deps --target DIR`` and run this again with
``PYTHONPATH=DIR``; alternate the builds, repeat each). One JSON line per timing on stdout:

    python benchmarks/ops_ab.py LABEL [PARTS]

PARTS (comma-separated, default all): ``routing`` (moe_routing alone and routing + dispatch,
T = 1 to 16384, DeepSeek-V3's k = 8 of E = 256, H = 7168, static bounds), ``dispatch``
(moe_dispatch_quant alone on a routing made before; at T = 4096 and 16384 every scale layout),
``floor`` (at T = 4096 and 16384: a ``fill_`` of the q rows' bytes and an ``index_select`` of
uint8 rows to their slots, the dispatch's write floors), ``silu`` (masked silu_mul_quant, T = 1
to 1024; ``silu_nopdl`` the same with ``fp8quant.set_pdl(False)``; ``silu_contig`` the
contiguous layout's, T = 1 to 16384, with the routing's ``m_indices`` and ``row_offsets``),
``silu_skew`` (masked silu_mul_quant and the engines' beside it, T = 16 to 1024, with skewed
counts: every token on the same 8 experts, and a Zipf law over the experts capped at T, each
with the busy experts first, 0-7, and last, 248-255, ops suffixed `` last``), ``silu_live``
(the masked SiLU and the engines' at T = 1's bounds with 8, 64 and 256 experts holding a row),
``silu_decode`` (the masked SiLU at T = 1's bounds with 0, 1 and 8 experts holding a row, with
and without PDL, the engines' beside it: the launch's own cost and what the live rows add),
``silu_mx`` (the masked silu_mul_mxfp8 and silu_mul_nvfp4 at the same T and bounds as ``silu``),
``engines`` (what engines run in their place, ``fp8quant.bench.engines``: quant + scatter beside
``routing``, the masked SiLU beside ``silu``, the contiguous one beside ``silu_contig``),
``nvfp4`` (nvfp4_quant and rms_norm_nvfp4, M = 1 to 32768 at K = 7168, and M = 2048 to 32768 at
K = 2048 and 1536 (DeepSeek-V3's q_lora_rank), ops suffixed `` k2048`` and `` k1536``; with
``copy`` also a ``copy_`` of the same bytes, half read and half written, the floor each shape's
percentage is judged against). Method of ``fp8quant.bench``: CUDA graphs over input sets
rotated through >= 256 MiB, median of replays; "pct_copy" against COPY_GBPS.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys

import torch

import fp8quant
from fp8quant import (
    moe_bounds,
    moe_dispatch_quant,
    moe_routing,
    nvfp4_global_scale,
    nvfp4_quant,
    rms_norm_nvfp4,
    silu_mul_mxfp8,
    silu_mul_nvfp4,
    silu_mul_quant,
)
from fp8quant.bench import engines, timing
from fp8quant.bench.moe import EXPERTS as E
from fp8quant.bench.moe import INTERMEDIATE as INTER
from fp8quant.bench.moe import TOP_K, routed_tokens

H = 7168  # DeepSeek-V3's hidden size
COPY_GBPS = 4200.0  # the H200's eager copy bandwidth, for the percentages
PARTS = (
    "routing",
    "dispatch",
    "floor",
    "silu",
    "silu_nopdl",
    "silu_contig",
    "silu_skew",
    "silu_live",
    "silu_decode",
    "silu_mx",
    "engines",
    "nvfp4",
    "copy",
)


@contextlib.contextmanager
def pdl_off():
    """fp8quant's launches without programmatic dependent launch inside, the setting restored after."""
    previous = fp8quant.set_pdl(False)
    try:
        yield
    finally:
        fp8quant.set_pdl(previous)


def emit(label: str, op: str, size: int, us: float, nbytes: int | None = None, sets: int = 1) -> None:
    record = {"label": label, "op": op, "T": size, "us": round(us, 3), "sets": sets}
    if nbytes:
        record["pct_copy"] = round(100 * nbytes / (us * 1e3) / COPY_GBPS, 1)
    print(json.dumps(record), flush=True)


def time_calls(call, sets: int, est_us: float) -> float:
    return timing.time_graph(call, sets, timing.graph_calls(sets, max(est_us, timing.CALL_FLOOR_US)))


def routing_ops(label: str, parts: set[str]) -> None:
    for t in (1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384):
        gen = torch.Generator(device="cuda").manual_seed(t)
        max_m_sum = moe_bounds(t, TOP_K, E).max_m_sum
        n = timing.rotation_sets(t * H * 2 + 8 * t * TOP_K)
        sets = [routed_tokens(t, H, "cuda", gen)[:2] for _ in range(n)]
        kept = t * TOP_K
        nbytes = t * H * 2 + kept * (H + 4 * H // 128) + 12 * kept  # x read; q, scales, row maps written
        est = nbytes / (COPY_GBPS * 1e3)
        us = time_calls(lambda i: moe_routing(sets[i][1], E, max_m_sum=max_m_sum), n, 5.0)
        emit(label, "routing", t, us, 12 * kept, n)
        us = time_calls(lambda i: moe_dispatch_quant(sets[i][0], moe_routing(sets[i][1], E, max_m_sum=max_m_sum)),
                        n, est)  # fmt: skip
        emit(label, "route+dispatch", t, us, nbytes, n)
        if "engines" in parts:
            us = time_calls(lambda i: engines.engine_scatter(*engines.engine_quant(sets[i][0]), sets[i][1], E, max_m_sum),
                            n, est)  # fmt: skip
            emit(label, "engines quant+scatter", t, us, nbytes, n)
        if "dispatch" in parts and t >= 16:
            routings = [moe_routing(ids, E, max_m_sum=max_m_sum) for _, ids in sets]
            for layout in ("mn_tma", "row", "mn", "packed_ue8m0") if t in (4096, 16384) else ("mn_tma",):
                us = time_calls(lambda i, lay=layout: moe_dispatch_quant(sets[i][0], routings[i], scale_layout=lay),
                                n, est)  # fmt: skip
                emit(label, f"dispatch {layout}", t, us, nbytes - 8 * kept, n)
        if "floor" in parts and t in (4096, 16384):
            rows_u8 = [x.view(torch.uint8)[:, :H].contiguous() for x, _ in sets]
            slot_tokens = [(ids.flatten().argsort() // TOP_K).to(torch.int64) for _, ids in sets]
            us = time_calls(lambda i: rows_u8[i].index_select(0, slot_tokens[i]), n, est)
            emit(label, "floor index_select u8", t, us, t * H + kept * H, n)
            out = torch.empty(kept * H, dtype=torch.uint8, device="cuda")
            emit(label, "floor fill", t, time_calls(lambda i: out.fill_(1), 1, est), kept * H)


#: A SiLU row's bytes: bf16 gate and up read; FP8 q and fp32 scales written
SILU_IN_BYTES = 4 * INTER
SILU_ROW_BYTES = SILU_IN_BYTES + INTER + 4 * INTER // 128
MASKED_SILU_T = (1, 4, 16, 64, 128, 512, 1024)


def masked_silu_input(t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    """The masked layout's input at T tokens' static bounds, its per-expert counts from a random
    routing, and the generator that made them."""
    gen = torch.Generator(device="cuda").manual_seed(t)
    bounds = moe_bounds(t, TOP_K, E)
    counts = moe_routing(routed_tokens(t, H, "cuda", gen)[1], E, max_m_sum=bounds.max_m_sum).counts
    y = torch.randn((E, bounds.max_m, 2 * INTER), device="cuda", generator=gen).to(torch.bfloat16)
    return y, counts, gen


def silu_ops(label: str, suffix: str = "", with_engines: bool = False) -> None:
    for t in MASKED_SILU_T:
        y, counts, _ = masked_silu_input(t)
        nbytes = t * TOP_K * SILU_ROW_BYTES  # live rows only
        us = time_calls(lambda i: silu_mul_quant(y, masked_m=counts), 1, nbytes / (COPY_GBPS * 1e3))
        emit(label, "silu masked" + suffix, t, us, nbytes)
        if with_engines:
            us = time_calls(lambda i: engines.engine_silu_quant_masked(y, counts), 1, nbytes / (COPY_GBPS * 1e3))
            emit(label, "engines silu masked", t, us, nbytes)


def live_counts(live: int, seed: int) -> torch.Tensor:
    """Per-expert counts at T = 1's bounds (max_m = 1): ``live`` random experts hold their one row."""
    counts = torch.zeros(E, dtype=torch.int32)
    counts[torch.randperm(E, generator=torch.Generator().manual_seed(seed))[:live]] = 1
    return counts.cuda()


def silu_live_ops(label: str) -> None:
    """The masked SiLU at T = 1's bounds (max_m = 1) with 8, 64 or all 256 experts holding one
    row, the engines' beside it: how its time grows with the live rows, apart from the idle
    experts' blocks."""
    y = masked_silu_input(1)[0]
    for live in (8, 64, E):
        counts = live_counts(live, live)
        nbytes = live * SILU_ROW_BYTES
        est = nbytes / (COPY_GBPS * 1e3)
        us = time_calls(lambda i: silu_mul_quant(y, masked_m=counts), 1, est)
        emit(label, f"silu masked {live} live", 1, us, nbytes)
        us = time_calls(lambda i: engines.engine_silu_quant_masked(y, counts), 1, est)
        emit(label, f"engines silu masked {live} live", 1, us, nbytes)


def silu_decode_ops(label: str) -> None:
    """The masked SiLU at T = 1's bounds with 0, 1 and 8 experts holding a row, with programmatic
    dependent launch and without, and the engines' (launched without it) beside it: the launch's
    cost with nothing to convert, and what the live rows add to it."""
    y = masked_silu_input(1)[0]
    for live in (0, 1, 8):
        counts = live_counts(live, live + 1)
        nbytes = live * SILU_ROW_BYTES
        est = nbytes / (COPY_GBPS * 1e3)
        us = time_calls(lambda i: silu_mul_quant(y, masked_m=counts), 1, est)
        emit(label, f"silu decode {live} live", 1, us, nbytes)
        with pdl_off():
            us = time_calls(lambda i: silu_mul_quant(y, masked_m=counts), 1, est)
        emit(label, f"silu decode {live} live (no PDL)", 1, us, nbytes)
        us = time_calls(lambda i: engines.engine_silu_quant_masked(y, counts), 1, est)
        emit(label, f"engines silu decode {live} live", 1, us, nbytes)


def skewed_counts(t: int, law: str, last: bool = False) -> torch.Tensor:
    """Per-expert rows of T tokens' top-k slots that load the experts unevenly: "top8" every token
    on experts 0-7; "zipf" expert e's share proportional to 1 / (e + 1), at most T an expert.
    With ``last`` the same counts in reverse expert order (the busy experts 248-255): a launch's
    blocks start in grid order, so where the busy experts sit changes its time."""
    if law == "top8":
        counts = torch.zeros(E, dtype=torch.int32)
        counts[:TOP_K] = t
    else:
        share = 1.0 / torch.arange(1, E + 1, dtype=torch.float64)
        counts = (share / share.sum() * t * TOP_K).floor().clamp(max=t).to(torch.int32)
    return (counts.flip(0) if last else counts).cuda()


def silu_skewed_ops(label: str) -> None:
    for t in (16, 128, 512, 1024):
        gen = torch.Generator(device="cuda").manual_seed(t)
        max_m = moe_bounds(t, TOP_K, E).max_m
        y = torch.randn((E, max_m, 2 * INTER), device="cuda", generator=gen).to(torch.bfloat16)
        for law, last in itertools.product(("top8", "zipf"), (False, True)):
            counts = skewed_counts(t, law, last)
            name = law + " last" * last
            nbytes = int(counts.sum()) * SILU_ROW_BYTES
            est = nbytes / (COPY_GBPS * 1e3)
            us = time_calls(lambda i: silu_mul_quant(y, masked_m=counts), 1, est)
            emit(label, f"silu masked {name}", t, us, nbytes)
            us = time_calls(lambda i: engines.engine_silu_quant_masked(y, counts), 1, est)
            emit(label, f"engines silu masked {name}", t, us, nbytes)


def silu_block_scaled_ops(label: str) -> None:
    for t in MASKED_SILU_T:
        y, counts, gen = masked_silu_input(t)
        scales = torch.rand(E, device="cuda", generator=gen) + 0.5
        live = t * TOP_K * SILU_IN_BYTES  # live rows' input; the outputs below
        for op, call, out_bytes in (
            ("silu masked mxfp8", lambda i: silu_mul_mxfp8(y, masked_m=counts), INTER + INTER // 32),
            ("silu masked nvfp4", lambda i: silu_mul_nvfp4(y, scales, masked_m=counts), INTER // 2 + INTER // 16),
        ):
            nbytes = live + t * TOP_K * out_bytes
            emit(label, op, t, time_calls(call, 1, nbytes / (COPY_GBPS * 1e3)), nbytes)


def silu_contiguous_ops(label: str, with_engines: bool = False) -> None:
    for t in (1, 16, 128, 1024, 4096, 16384):
        gen = torch.Generator(device="cuda").manual_seed(t)
        bounds = moe_bounds(t, TOP_K, E)
        routing = moe_routing(routed_tokens(t, H, "cuda", gen)[1], E, max_m_sum=bounds.max_m_sum)
        y = torch.randn((bounds.max_m_sum, 2 * INTER), device="cuda", generator=gen).to(torch.bfloat16)
        nbytes = t * TOP_K * SILU_ROW_BYTES  # live rows only
        est = nbytes / (COPY_GBPS * 1e3)
        us = time_calls(
            lambda i: silu_mul_quant(y, m_indices=routing.m_indices, row_offsets=routing.row_offsets), 1, est
        )
        emit(label, "silu contiguous", t, us, nbytes)
        if with_engines:
            us = time_calls(lambda i: engines.engine_silu_quant(y, routing.m_indices), 1, est)
            emit(label, "engines silu contiguous", t, us, nbytes)


def nvfp4_ops(label: str, parts: set[str]) -> None:
    shapes = [(m, 7168) for m in (1, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768)]
    shapes += [(m, k) for k in (2048, 1536) for m in (2048, 8192, 32768)]
    for m, k in shapes:
        suffix = "" if k == 7168 else f" k{k}"
        n = timing.rotation_sets(m * k * 2)
        sets = [timing.random_input(m, k, torch.bfloat16, "cuda") for _ in range(n)]
        global_scale = nvfp4_global_scale(sets[0])
        weight = timing.random_input(1, k, torch.bfloat16, "cuda").view(k)
        scale_bytes = (m + 127) // 128 * 128 * ((k // 16 + 3) // 4 * 4)  # swizzled
        nbytes = m * k * 2 + m * k // 2 + scale_bytes
        est = nbytes / (COPY_GBPS * 1e3)
        us = time_calls(lambda i: nvfp4_quant(sets[i], global_scale), n, est)
        emit(label, "nvfp4" + suffix, m, us, nbytes, n)
        us = time_calls(lambda i: rms_norm_nvfp4(sets[i], weight, global_scale), n, est)
        emit(label, "rms_norm_nvfp4" + suffix, m, us, nbytes + 2 * k, n)
        if "copy" in parts and m >= 2048:  # the same bytes copied: half read, half written
            half = nbytes // 2
            srcs = [s.view(torch.uint8).flatten()[:half] for s in sets]
            dst = torch.empty(half, dtype=torch.uint8, device="cuda")
            emit(label, "copy" + suffix, m, time_calls(lambda i: dst.copy_(srcs[i]), n, est), 2 * half, n)


def main() -> None:
    label = sys.argv[1]
    parts = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else set(PARTS)
    print(json.dumps({"label": label, "fp8quant": fp8quant.__file__, "gpu": torch.cuda.get_device_name()}), flush=True)
    if parts & {"routing", "dispatch", "floor"}:
        routing_ops(label, parts)
    if "silu" in parts:
        silu_ops(label, with_engines="engines" in parts)
    if "silu_nopdl" in parts:  # the same without programmatic dependent launch
        with pdl_off():
            silu_ops(label, " (no PDL)")
    if "silu_contig" in parts:
        silu_contiguous_ops(label, with_engines="engines" in parts)
    if "silu_skew" in parts:
        silu_skewed_ops(label)
    if "silu_live" in parts:
        silu_live_ops(label)
    if "silu_decode" in parts:
        silu_decode_ops(label)
    if "silu_mx" in parts:
        silu_block_scaled_ops(label)
    if "nvfp4" in parts:
        nvfp4_ops(label, parts)


if __name__ == "__main__":
    main()
