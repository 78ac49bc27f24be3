"""``python -m fp8quant bench --moe``: one DeepSeek-V3 MoE layer (H = 7168 from --k, E = 256
experts, top-8, intermediate size 2048, bf16) at every batch size engines run, T from --m
(default 1, 4, 16, 64, 128, 512, 1024, 4096, 16384), each buffer sized by the static bounds
engines give CUDA graphs (:func:`fp8quant.moe_bounds`), side by side with the engines' chain
(:mod:`fp8quant.bench.engines`: Triton kernels around the same GEMMs, written here).

Layer rows (the whole layer per call; "% copy" is the share of the **weight-read floor**: the
active experts' weight bytes at copy bandwidth, the bound of decode):

- ``deep_gemm contiguous``, ``deep_gemm masked``, ``triton contiguous``, ``triton masked``:
  :func:`fp8quant.moe_layer` on each backend and layout (DeepGEMM's rows when it imports);
  ``backend="auto"`` runs the best of them by :data:`fp8quant.moe_layer.AUTO_PLAN`;
- ``engines contiguous``, ``engines masked``: the engines' chain with DeepGEMM;
- ``floor``: the active experts' weights at copy bandwidth.

Op rows ("% copy" for the bytes of the rows that hold tokens): ``routing`` (moe_routing alone:
ids read, the row maps written), ``dispatch`` (moe_dispatch_quant alone, on a routing made
before), ``route+dispatch`` (both, contiguous) beside ``engines quant+scatter``; ``silu masked`` and ``silu
contiguous`` (silu_mul_quant on the first GEMM's output) beside the engines' SiLU + quant; and
``combine`` beside ``engines gather``. The masked layout is timed up to T = 1024 (its buffers
grow as E x T rows). Same method as the other modes: CUDA graphs of N calls over rotated input
sets, median of the replays.
"""

from __future__ import annotations

import math

import torch

from .. import grouped_gemm
from ..moe import moe_bounds, moe_combine, moe_dispatch_quant, moe_routing, silu_mul_quant
from ..moe_layer import ExpertWeights, _deep_gemm, moe_layer, prepare_experts
from . import engines, timing

__all__ = ["run_moe"]

TOP_K = 8
EXPERTS = 256
INTERMEDIATE = 2048  # DeepSeek-V3's moe_intermediate_size
TOKENS = (1, 4, 16, 64, 128, 512, 1024, 4096, 16384)
MASKED_MAX_T = 1024  # the masked layout's buffers hold E x T rows
LAYER_GRAPH_US = 3000.0  # work per graph replay for the layer rows


def expert_weights(e: int, n: int, k: int, device: torch.device, gen: torch.Generator) -> ExpertWeights:
    """Random weights ``[e, n, k]`` quantized in 128 x 128 blocks, a few experts at a time."""
    chunks = [
        prepare_experts((torch.randn((min(16, e - i), n, k), generator=gen, device=device) / k**0.5).to(torch.bfloat16))
        for i in range(0, e, 16)
    ]  # fmt: skip
    return ExpertWeights(torch.cat([c.q for c in chunks]), torch.cat([c.scale for c in chunks]))


def routed_tokens(t: int, h: int, device: torch.device, gen: torch.Generator):
    """x ``[t, h]`` bf16, top-8 of 256 experts by a random softmax router (distinct per token)."""
    x = torch.randn((t, h), generator=gen, device=device).to(torch.bfloat16)
    weights, ids = torch.topk(torch.randn((t, EXPERTS), generator=gen, device=device).softmax(-1), TOP_K)
    return x, ids.to(torch.int32), weights


def time_calls(call, sets: int, est_us: float) -> float:
    """timing.time_graph with about LAYER_GRAPH_US of work per replay."""
    calls = sets * max(1, math.ceil(min(64, max(2, LAYER_GRAPH_US / est_us)) / sets))
    return timing.time_graph(call, sets, calls), calls


def time_shape(
    t: int, h: int, dtype: torch.dtype, copy_gbps: float, rotation_bytes: int, weights
) -> list[timing.Result]:
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(t)
    w13, w2 = weights
    bounds = moe_bounds(t, TOP_K, EXPERTS)
    set_bytes = t * h * 2 + 8 * t * TOP_K
    sets = [routed_tokens(t, h, device, gen) for _ in range(timing.rotation_sets(set_bytes, rotation_bytes))]
    x0, ids0, w0 = sets[0]
    routing = moe_routing(ids0, EXPERTS, max_m_sum=bounds.max_m_sum, max_m=bounds.max_m)
    kept = t * TOP_K
    active = int(torch.unique(ids0).numel())
    weight_bytes = active * (w13.q[0].numel() + w2.q[0].numel() + 4 * (w13.scale[0].numel() + w2.scale[0].numel()))
    results: list[timing.Result] = []

    def add(name: str, call, nbytes: int, est_us: float, n_sets: int) -> None:
        us, calls = time_calls(call, n_sets, est_us)
        results.append(timing.Result(t, h, name, us, nbytes, n_sets, calls))

    # Ops: real rows' bytes. Route + dispatch: ids and x read; q rows, scales and the row maps written
    g = h // 128
    nbytes = t * h * 2 + kept * (h + 4 * g) + 4 * t * TOP_K * 3
    est = max(timing.CALL_FLOOR_US, nbytes / (copy_gbps * 1e3))
    n = len(sets)
    routings = [moe_routing(ids, EXPERTS, max_m_sum=bounds.max_m_sum) for _, ids, _ in sets]
    add("routing", lambda i: moe_routing(sets[i][1], EXPERTS, max_m_sum=bounds.max_m_sum), 4 * kept * 3,
        timing.CALL_FLOOR_US, n)  # fmt: skip
    add("dispatch", lambda i: moe_dispatch_quant(sets[i][0], routings[i]), nbytes - 4 * kept * 2, est, n)
    routings = None  # freed: the calls above ran
    add("route+dispatch", lambda i: moe_dispatch_quant(
        sets[i][0], moe_routing(sets[i][1], EXPERTS, max_m_sum=bounds.max_m_sum)), nbytes, est, n)  # fmt: skip
    add("engines quant+scatter", lambda i: engines.engine_scatter(
        *engines.engine_quant(sets[i][0]), sets[i][1], EXPERTS, bounds.max_m_sum), nbytes, est, n)  # fmt: skip

    # SiLU-and-mul + quantize: live rows read (2I bf16), q and scales written
    inter = INTERMEDIATE
    nbytes = kept * (2 * inter * 2 + inter + 4 * inter // 128)
    est = max(timing.CALL_FLOOR_US, nbytes / (copy_gbps * 1e3))
    if t <= MASKED_MAX_T:
        y1 = torch.randn((EXPERTS, bounds.max_m, 2 * inter), device=device, generator=gen).to(torch.bfloat16)
        add("silu masked", lambda i: silu_mul_quant(y1, masked_m=routing.counts), nbytes, est, 1)
        add("engines silu masked", lambda i: engines.engine_silu_quant_masked(y1, routing.counts), nbytes, est, 1)
        y1 = None  # freed: the calls above ran
    y1 = torch.randn((bounds.max_m_sum, 2 * inter), device=device, generator=gen).to(torch.bfloat16)
    add("silu contiguous", lambda i: silu_mul_quant(y1, m_indices=routing.m_indices, row_offsets=routing.row_offsets),
        nbytes, est, 1)  # fmt: skip
    add("engines silu contiguous", lambda i: engines.engine_silu_quant(y1, routing.m_indices), nbytes, est, 1)
    y1 = None  # freed: the calls above ran

    # Combine: the kept rows read, the output written
    y2 = torch.randn((bounds.max_m_sum, h), device=device, generator=gen).to(torch.bfloat16)
    nbytes = kept * h * 2 + t * h * 2 + 8 * kept
    est = max(timing.CALL_FLOOR_US, nbytes / (copy_gbps * 1e3))
    add("combine", lambda i: moe_combine(y2, routing.inv_perm, w0), nbytes, est, 1)
    add("engines gather", lambda i: engines.engine_gather(y2, routing.inv_perm, w0), nbytes, est, 1)
    y2 = None  # freed: the calls above ran

    # The layer
    floor_us = weight_bytes / (copy_gbps * 1e3)
    results.append(timing.Result(t, h, "floor", floor_us, weight_bytes, 1, 1))
    layer_sets = sets[: max(1, min(4, len(sets)))]
    n = len(layer_sets)
    deep_gemm = _deep_gemm() is not None and torch.cuda.get_device_capability(device)[0] == 9
    layouts = ("contiguous", "masked") if t <= MASKED_MAX_T else ("contiguous",)
    backends = (("deep_gemm",) if deep_gemm else ()) + (("triton",) if grouped_gemm.available() else ())
    for backend in backends:
        for layout in layouts:
            add(f"{backend} {layout}", lambda i, b=backend, lay=layout: moe_layer(*layer_sets[i], w13, w2, layout=lay,
                backend=b), weight_bytes, floor_us, n)  # fmt: skip
    if deep_gemm:
        for layout in layouts:
            add(f"engines {layout}", lambda i, lay=layout: engines.engine_layer(
                *layer_sets[i], w13, w2, layout=lay, max_m_sum=bounds.max_m_sum), weight_bytes, floor_us, n)  # fmt: skip
    return results


def run_moe(args) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("--moe times the GPU kernels; no CUDA GPU was found")
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(0)
    timing.progress(f"quantizing {EXPERTS} experts' weights (H = {args.k}, I = {INTERMEDIATE})")
    weights = (expert_weights(EXPERTS, 2 * INTERMEDIATE, args.k, device, gen),
               expert_weights(EXPERTS, args.k, INTERMEDIATE, device, gen))  # fmt: skip
    return timing.run_shapes(
        args, [(t, args.k) for t in args.m or TOKENS],
        lambda t, h, dtype, copy_gbps, rotation: time_shape(t, h, dtype, copy_gbps, rotation, weights),
        refusal="--moe times the GPU kernels", labels=("T", "H"),
        op=f"MoE layer and ops (k = {TOP_K} of E = {EXPERTS}, I = {INTERMEDIATE}, static bounds)", rows="T",
        granularity="groups of 128, mn_tma scales; layer rows: % of the weight-read floor",
    )  # fmt: skip
