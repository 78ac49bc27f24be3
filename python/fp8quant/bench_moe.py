"""``python -m fp8quant bench --moe``: the MoE ops at DeepSeek-V3's shape (T tokens from --m,
default 4096; H from --k, default 7168; k = 8 of E = 256 experts, about 3% of slots dropped;
intermediate size 2048), each against the copy bandwidth for the bytes it must move and beside
the chain of separate ops it replaces:

- moe_dispatch_quant (contiguous layout, mn_tma scales): reads each kept slot's token row, writes
  every row of q (padding included) and the scales; chain: PyTorch's gather, then fp8quant's
  quantizer.
- silu_mul_quant on the contiguous layout ``[M_sum, 2 * 2048]``: reads every row, writes q and
  scales; chain: ``F.silu(gate) * up``, then fp8quant's quantizer.
- moe_combine: reads the expert rows (one per kept slot), writes the output; chain: gather,
  weight, sum in float32, cast.
- moe_routing with ``max_m_sum = T * k + E * 127`` (the bound engines size buffers by, so no
  synchronization): reads topk_ids, writes counts, offsets, the two row maps (every row of the
  bound) and inv_perm; chain: the reference's PyTorch ops made synchronization-free
  (:func:`torch_routing`). Latency-bound: its percentage says little.

Same method as the other modes: CUDA graphs of N calls over rotated buffer sets, median of the
replays.
"""

from __future__ import annotations

import torch

from . import bench, reference
from .layouts import scale_spec
from .moe import moe_combine, moe_dispatch_quant, moe_routing, silu_mul_quant
from .quant import per_token_group_quant

__all__ = ["run_moe"]

TOP_K = 8
EXPERTS = 256
INTERMEDIATE = 2048  # DeepSeek-V3's moe_intermediate_size


def torch_combine(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """What engines run without a fused kernel: gather the rows, weight them, sum in float32."""
    keep = (rows >= 0).unsqueeze(-1)
    gathered = y[rows.clamp(min=0).long()].float()  # [T, k, H]
    return (gathered * (weights.unsqueeze(-1) * keep)).sum(1).to(y.dtype)


def torch_routing(ids: torch.Tensor, e: int, align: int, rows: int) -> tuple[torch.Tensor, ...]:
    """The reference's routing as engines write it in PyTorch without a device-to-host read:
    a count by scatter_add, a stable argsort for each slot's rank, and scatters of the row maps
    into ``rows`` rows (dropped slots land in one spare row)."""
    t, k = ids.shape
    flat = ids.reshape(-1).long()
    valid = (flat >= 0) & (flat < e)
    expert = torch.where(valid, flat, e)
    counts = torch.zeros(e + 1, dtype=torch.int64, device=ids.device).scatter_add_(0, expert, torch.ones_like(expert))
    offsets = torch.nn.functional.pad(torch.cumsum((counts[:e] + align - 1) // align * align, 0), (1, 0))
    first = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    order = torch.argsort(expert, stable=True)
    rank = torch.empty_like(expert)
    rank[order] = torch.arange(expert.numel(), device=ids.device) - first[expert[order]]
    row = torch.where(valid, offsets[expert.clamp(max=e - 1)] + rank, rows)
    m_indices = torch.full((rows + 1,), -1, dtype=torch.int32, device=ids.device)
    row_token = torch.full((rows + 1,), -1, dtype=torch.int32, device=ids.device)
    m_indices[row] = expert.to(torch.int32)
    row_token[row] = (torch.arange(expert.numel(), device=ids.device) // k).to(torch.int32)
    inv_perm = torch.where(valid, row, -1).to(torch.int32).view(t, k)
    return counts[:e].to(torch.int32), offsets.to(torch.int32), m_indices[:rows], row_token[:rows], inv_perm


def time_shape(t: int, h: int, dtype: torch.dtype, copy_gbps: float, rotation_bytes: int) -> list[bench.Result]:
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(t)
    ids = torch.randint(0, EXPERTS, (t, TOP_K), generator=gen, device=device, dtype=torch.int32)
    ids[torch.rand((t, TOP_K), generator=gen, device=device) < 0.03] = -1
    routing = reference.moe_routing(ids, EXPERTS)
    rows = routing.inv_perm
    weights = torch.rand((t, TOP_K), generator=gen, device=device)
    kept = int((rows >= 0).sum())
    m_sum = routing.m_indices.numel()
    size = dtype.itemsize

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    # Routing: topk_ids read; counts, offsets, both row maps over the whole bound, inv_perm written
    bound = t * TOP_K + EXPERTS * 127
    nbytes = 4 * t * TOP_K * 2 + 8 * bound + 4 * (2 * EXPERTS + 1)
    results = bench.fused_and_chain(
        t, h, ("moe_routing", "routing chain"),
        lambda s: moe_routing(s, EXPERTS, max_m_sum=bound), lambda s: torch_routing(s, EXPERTS, 128, bound),
        lambda: ids.clone(), nbytes, nbytes, copy_gbps, rotation_bytes, 8,
    )  # fmt: skip

    # Combine: the expert rows of the kept slots read, the output written, slot indices and weights
    results += bench.fused_and_chain(
        t, h, ("moe_combine", "combine chain"),
        lambda s: moe_combine(s[0], rows, weights, out=s[1]), lambda s: torch_combine(s[0], rows, weights),
        lambda: (random(m_sum, h), torch.empty((t, h), dtype=dtype, device=device)),
        (kept + t) * h * size + 8 * t * TOP_K, (m_sum + t) * h * size, copy_gbps, rotation_bytes, 8,
    )  # fmt: skip

    # Dispatch + quantize: each kept slot's token read, every row of q and the scales written
    tokens = routing.row_token.clamp(min=0).long()
    nbytes = kept * h * size + m_sum * h + 4 * scale_spec("mn_tma", m_sum, h // 128).numel
    results += bench.fused_and_chain(
        t, h, ("dispatch+quant", "dispatch chain"),
        lambda x: moe_dispatch_quant(x, routing, scale_layout="mn_tma"),
        lambda x: per_token_group_quant(x[tokens], 128, scale_layout="mn_tma"),
        lambda: random(t, h), nbytes, nbytes, copy_gbps, rotation_bytes, 4,
    )  # fmt: skip

    # SiLU-and-mul + quantize on the contiguous layout
    nbytes = m_sum * INTERMEDIATE * (2 * size + 1) + 4 * scale_spec("mn_tma", m_sum, INTERMEDIATE // 128).numel
    results += bench.fused_and_chain(
        m_sum, 2 * INTERMEDIATE, ("silu_mul_quant", "silu chain"),
        lambda x: silu_mul_quant(x, scale_layout="mn_tma"),
        lambda x: per_token_group_quant(reference.silu_and_mul(x), 128, scale_layout="mn_tma"),
        lambda: random(m_sum, 2 * INTERMEDIATE), nbytes, nbytes, copy_gbps, rotation_bytes, 4,
    )  # fmt: skip
    return results


def run_moe(args) -> int:
    return bench.run_shapes(
        args, [(t, args.k) for t in args.m or [4096]], time_shape, refusal="--moe times the GPU kernels",
        labels=("T", "H"), op=f"MoE ops (k = {TOP_K} of E = {EXPERTS})", rows="rows",
        granularity="groups of 128, mn_tma scales",
    )  # fmt: skip
