"""The expert-parallel checks, run by every rank of a process group: on CPU tensors over gloo
(test_expert_parallel.py) and on GPUs over NCCL (test_expert_parallel_gpu.py).

:func:`run_world` starts ``world`` processes (``torch.multiprocessing``, a FileStore), each of
which runs the named scenarios in order and records, per scenario, what failed on it (a rank
that fails alone in the middle of a scenario leaves the others to fail by the collectives'
TIMEOUT). Every rank builds the same global batch (all ranks' tokens, all
experts) and checks its own part against the single-process ops of that whole batch: the layer
against ``fp8quant.moe_layer`` (reference backend), the landed rows against
``fp8quant.moe_dispatch_quant`` of all tokens for the rank's expert range, bit for bit.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.overrides import TorchFunctionMode

import fp8quant
from fp8quant import expert_ffn, expert_parallel, grouped_gemm
from fp8quant.expert_parallel import WireFormat, ep_combine, ep_dispatch, ep_moe_layer
from fp8quant.gemm import _have_deep_gemm, calc_diff

EXPERTS_PER_RANK, HIDDEN, INTER, TOP_K = 4, 256, 128, 3
#: T per rank: uneven, and a rank without tokens (which still receives some)
TOKENS = {2: (6, 3), 4: (5, 0, 7, 3)}
#: A rank whose experts no token picks: it receives nothing (None: every rank receives)
IDLE_RANK = {2: None, 4: 2}
TIMEOUT = timedelta(seconds=90)  # a collective waiting longer than this fails the scenario


# --- The global batch ----------------------------------------------------------------------------


def global_batch(world: int, idle_rank: int | None, device: torch.device):
    """All ranks' tokens ``x [T, H]`` (random bf16), their top-k ids and weights, and all experts'
    weights, identical on every rank. Rank 0's tokens: token 0's experts are all on rank 0 itself,
    token 4's all on rank 1; token 1 drops a slot (-1), token 2 has an id past the last expert
    (dropped too), token 3 goes nowhere."""
    gen = torch.Generator().manual_seed(world)
    t, e = sum(TOKENS[world]), EXPERTS_PER_RANK * world
    x = torch.randn(t, HIDDEN, generator=gen).to(torch.bfloat16)
    experts = torch.tensor([i for i in range(e) if i // EXPERTS_PER_RANK != idle_rank])
    ids = torch.stack([experts[torch.randperm(experts.numel(), generator=gen)[:TOP_K]] for _ in range(t)])
    ids[0] = torch.randperm(EXPERTS_PER_RANK, generator=gen)[:TOP_K]
    ids[4] = EXPERTS_PER_RANK + torch.randperm(EXPERTS_PER_RANK, generator=gen)[:TOP_K]
    ids[1, 1] = -1
    ids[2, 0] = e + 1
    ids[3] = -1
    weights = torch.rand(t, TOP_K, generator=gen)
    w13 = (torch.randn(e, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, HIDDEN, INTER, generator=gen) / INTER**0.5).to(torch.bfloat16)
    x, ids, weights, w13, w2 = (v.to(device) for v in (x, ids.to(torch.int32), weights, w13, w2))
    return x, ids, weights, fp8quant.prepare_experts(w13), fp8quant.prepare_experts(w2)


@dataclass
class Rank:
    """One rank's view of the global batch in a group of ``world`` ranks."""

    rank: int
    world: int
    device: torch.device
    group: object = None
    idle_rank: int | None = None

    def __post_init__(self) -> None:
        self.batch = global_batch(self.world, self.idle_rank, self.device)
        first = sum(TOKENS[self.world][: self.rank])
        self.tokens = slice(first, first + TOKENS[self.world][self.rank])
        self.bound = max(TOKENS[self.world])  # max_tokens_per_rank
        self.num_experts = EXPERTS_PER_RANK * self.world
        self.experts = slice(self.rank * EXPERTS_PER_RANK, (self.rank + 1) * EXPERTS_PER_RANK)

    def mine(self, t: torch.Tensor) -> torch.Tensor:
        return t[self.tokens]

    def local_weights(self) -> tuple[fp8quant.ExpertWeights, fp8quant.ExpertWeights]:
        return tuple(fp8quant.ExpertWeights(w.q[self.experts], w.scale[self.experts]) for w in self.batch[3:])

    def dispatch(self, mode: str, layout: str, wire: str = "fp8", x: torch.Tensor | None = None):
        x = self.batch[0] if x is None else x
        bound = self.bound if mode == "low_latency" else None
        return ep_dispatch(self.mine(x), self.mine(self.batch[1]), self.num_experts, group=self.group, mode=mode,
                           layout=layout, max_tokens_per_rank=bound, wire=wire)  # fmt: skip


def assert_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{what}: {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    )
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"{what}: bytes differ"


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of t's buffer (a scale layout's padding rows included)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


# --- Expected bytes on the wire, from the global ids alone ---------------------------------------


def expected_bytes(r: Rank, mode: str, wire: str) -> tuple[int, int]:
    """(dispatch, combine) bytes rank r sends to other ranks."""
    ids = r.batch[1].long()
    owner = torch.where((ids >= 0) & (ids < r.num_experts), ids // EXPERTS_PER_RANK, -1)
    source = torch.repeat_interleave(torch.arange(r.world), torch.tensor(TOKENS[r.world])).to(ids.device)
    peers = [p for p in range(r.world) if p != r.rank]
    row_bytes = WireFormat(wire, HIDDEN, TOP_K).row_bytes
    if mode == "low_latency":
        return len(peers) * r.bound * row_bytes, len(peers) * r.bound * TOP_K * HIDDEN * 2
    mine = owner[r.tokens]
    tokens = sum(int((mine == p).any(1).sum()) for p in peers)
    slots = sum(int((owner[source == p] == r.rank).sum()) for p in peers)
    return tokens * row_bytes + 16 * len(peers), slots * HIDDEN * 2


# --- Scenarios -----------------------------------------------------------------------------------


def check_layer(r: Rank, mode: str, layout: str, wire: str) -> None:
    """dispatch, the local experts (reference GEMMs), combine: the single-process layer of the
    whole batch, bit for bit; and the bytes on the wire."""
    x, ids, weights, w13, w2 = r.batch
    want = fp8quant.moe_layer(x, ids, weights, w13, w2, layout=layout, backend="reference")
    sent = r.dispatch(mode, layout, wire)
    y = expert_ffn(sent.q, sent.scale, sent.routing, *r.local_weights(), layout=layout, backend="reference")
    got = ep_combine(y, sent.handle, r.mine(weights))
    assert_bits(got, r.mine(want), f"rank {r.rank} output")
    assert (sent.handle.dispatch_bytes, sent.handle.combine_bytes(y)) == expected_bytes(r, mode, wire)


def check_layer_api(r: Rank, mode: str) -> None:
    """ep_moe_layer with every default (mode from the bound, layout from the mode)."""
    x, ids, weights, w13, w2 = r.batch
    bound = r.bound if mode == "low_latency" else None
    got = ep_moe_layer(r.mine(x), r.mine(ids), r.mine(weights), *r.local_weights(), group=r.group,
                       max_tokens_per_rank=bound, backend="reference")  # fmt: skip
    want = fp8quant.moe_layer(x, ids, weights, w13, w2, backend="reference")
    assert_bits(got, r.mine(want), f"rank {r.rank} output")


def token_rows(routing, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool masks over the layout's rows: rows holding a token, and tile padding (rows without a
    token inside an expert's tiles), docs/contract.md "Rows without a token"."""
    if layout == "contiguous":
        rows = torch.arange(routing.m_indices.numel(), device=routing.m_indices.device)
        filled = routing.m_indices >= 0
        return filled, ~filled & (rows < routing.row_offsets[-1])
    rank = torch.arange(routing.max_m, device=routing.counts.device)
    counts = routing.counts.unsqueeze(1)
    filled = rank < counts
    return filled, ~filled & (rank < (counts + 127) // 128 * 128)


def check_dispatch(r: Rank, mode: str, layout: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """The rows this rank's experts get: the routing and bytes of fp8quant.moe_dispatch_quant of
    all tokens for this rank's expert range, with the same bounds. On the CPU every byte (padding
    written as the reference writes it); on the GPU the contract's: rows holding a token, and
    zero scales on tile padding."""
    x, ids = r.batch[0].to(dtype), r.batch[1]
    sent = r.dispatch(mode, layout, x=x)
    got = sent.routing
    want = fp8quant.moe_routing(ids, EXPERTS_PER_RANK, expert_offset=r.experts.start,
                                max_m_sum=got.m_indices.numel(), max_m=got.max_m)  # fmt: skip
    for name in ("counts", "row_offsets", "m_indices"):
        assert torch.equal(getattr(got, name), getattr(want, name)), f"routing.{name}"
    q, scale = fp8quant.moe_dispatch_quant(x, want, layout=layout, max_m=got.max_m)
    assert sent.scale.stride() == scale.stride(), f"scale strides {sent.scale.stride()} != {scale.stride()}"
    if not x.is_cuda:
        assert_bits(sent.q, q, "q")
        assert torch.equal(storage_bytes(sent.scale), storage_bytes(scale)), "scale buffer bytes"
        return
    filled, padding = token_rows(want, layout)
    assert_bits(sent.q.view(torch.uint8)[filled], q.view(torch.uint8)[filled], "q of rows holding a token")
    assert_bits(sent.scale[filled], scale[filled], "scales of rows holding a token")
    assert not sent.scale[padding].any(), "tile padding scales must be 0"


class HostReads(TorchFunctionMode):
    """Records the calls made from ``filename`` that read a tensor's values back to the host (a
    device-to-host synchronization on a GPU)."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero,
             torch.Tensor.unique, torch.unique, torch.masked_select, torch.Tensor.masked_select,
             torch.Tensor.cpu}  # fmt: skip

    def __init__(self, filename: str) -> None:
        super().__init__()
        self.filename, self.reads = filename, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        bool_index = func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in _flat(args[1])
        )
        if (func in self.READS or bool_index) and sys._getframe(1).f_code.co_filename == self.filename:
            self.reads.append(f"{func.__name__} at line {sys._getframe(1).f_lineno}")
        return func(*args, **(kwargs or {}))


def _flat(index) -> tuple:
    return index if isinstance(index, tuple) else (index,)


def check_host_reads(r: Rank, mode: str) -> None:
    """What fp8quant.expert_parallel itself reads back from the device: nothing in the low-latency
    mode, the count exchange's split sizes (once) in the normal mode. (The ops it calls run their
    references here; on a GPU their kernels read nothing back with static bounds, and the GPU
    test runs this path under torch.cuda.set_sync_debug_mode("error").)"""
    with HostReads(expert_parallel.__file__) as reads:
        sent = r.dispatch(mode, "masked")
        ep_combine(torch.zeros((*sent.q.shape[:-1], HIDDEN), dtype=torch.bfloat16, device=r.device), sent.handle,
                   r.mine(r.batch[2]))  # fmt: skip
    want = [] if mode == "low_latency" else ["tolist"]
    assert [read.split(" ")[0] for read in reads.reads] == want, reads.reads


def check_subgroups(r: Rank) -> None:
    """Two groups of two ranks in a world of four, each running the 2-rank batch: expert ranges
    and peers follow the rank in the group, not in the world."""
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    sub = Rank(r.rank % 2, 2, r.device, group=groups[r.rank // 2])
    for mode in ("normal", "low_latency"):
        check_layer(sub, mode, "contiguous", "fp8")


def check_validation(r: Rank) -> None:
    """Arguments are refused before any communication, naming the bad one (every rank refuses)."""
    x, ids, weights = (r.mine(t) for t in r.batch[:3])
    w13, w2 = r.local_weights()
    e = r.num_experts
    sent = r.dispatch("normal", "masked")
    y = torch.zeros((*sent.q.shape[:-1], HIDDEN), dtype=torch.bfloat16, device=r.device)
    cases: list[tuple[Callable[[], object], type, str]] = [
        (lambda: ep_dispatch(x, ids[:, :0], e), TypeError, "topk_ids"),
        (lambda: ep_dispatch(x, ids.float(), e), TypeError, "topk_ids"),
        (lambda: ep_dispatch(x.new_zeros(x.shape[0] + 1, HIDDEN), ids, e), ValueError, "topk_ids has"),
        (lambda: ep_dispatch(x[:, :100], ids, e), ValueError, "H=100"),
        (lambda: ep_dispatch(x.view(torch.int16), ids, e), TypeError, "x must be"),
        (lambda: ep_dispatch(x.float(), ids, e, wire="bf16"), TypeError, "wire='bf16'"),
        (lambda: ep_dispatch(x, ids, e + 1), ValueError, "num_experts must be a positive multiple"),
        (lambda: ep_dispatch(x, ids, e, mode="fast"), ValueError, "mode must be"),
        (lambda: ep_dispatch(x, ids, e, layout="blocked"), ValueError, "layout must be"),
        (lambda: ep_dispatch(x, ids, e, wire="fp4"), ValueError, "wire must be"),
        (lambda: ep_dispatch(x, ids, e, align=0), ValueError, "align"),
        (lambda: ep_dispatch(x, ids, e, mode="low_latency"), ValueError, "needs max_tokens_per_rank"),
        (lambda: ep_dispatch(x, ids, e, max_tokens_per_rank=8), ValueError, "max_tokens_per_rank is"),
        (lambda: ep_dispatch(x.new_zeros(9, HIDDEN), ids.new_zeros(9, TOP_K), e, mode="low_latency",
                             max_tokens_per_rank=8), ValueError, "smaller than this rank's 9 tokens"),
        (lambda: ep_combine(y, None, weights), TypeError, "handle"),
        (lambda: ep_combine(y[:1], sent.handle, weights), ValueError, "y must be a contiguous tensor [4, "),
        (lambda: ep_combine(y.transpose(0, 1).contiguous().transpose(0, 1), sent.handle, weights), ValueError,
         "contiguous"),
        (lambda: ep_combine(y, sent.handle, weights[:, :1]), ValueError, "topk_weights"),
        (lambda: ep_moe_layer(x, ids, weights[:, :1], w13, w2), ValueError, "topk_weights"),
        (lambda: ep_moe_layer(x, ids, weights, w2, w13), ValueError, "but x has H"),
        (lambda: ep_moe_layer(x, ids, weights, w13, w2.q), TypeError, "w2"),
        (lambda: ep_moe_layer(x, ids, weights, w13, w2, backend="cutlass"), ValueError, "backend"),
    ]  # fmt: skip
    if not x.is_cuda:
        cases.append((lambda: ep_moe_layer(x, ids, weights, w13, w2, backend="triton"), ValueError, "needs CUDA"))
    for call, error, match in cases:
        try:
            call()
        except error as exc:
            assert match in str(exc), f"{error.__name__} {exc!r} does not say {match!r}"
        else:
            raise AssertionError(f"no {error.__name__} ({match!r})")


def _layer_scenarios() -> dict[str, Callable[[Rank], None]]:
    return {
        f"layer {mode} {layout} {wire}": lambda r, m=mode, lay=layout, w=wire: check_layer(r, m, lay, w)
        for mode in ("normal", "low_latency")
        for layout in ("contiguous", "masked")
        for wire in ("fp8", "bf16")
    }


SCENARIOS: dict[str, Callable[[Rank], None]] = {
    **_layer_scenarios(),
    **{f"layer api {mode}": lambda r, m=mode: check_layer_api(r, m) for mode in ("normal", "low_latency")},
    **{
        f"dispatch {mode} {layout}": lambda r, m=mode, lay=layout: check_dispatch(r, m, lay)
        for mode in ("normal", "low_latency")
        for layout in ("contiguous", "masked")
    },
    "dispatch float32 x": lambda r: check_dispatch(r, "normal", "contiguous", torch.float32),
    **{f"host reads {mode}": lambda r, m=mode: check_host_reads(r, m) for mode in ("normal", "low_latency")},
    "validation": check_validation,
}
#: Scenarios of a world of four ranks only
WORLD4_SCENARIOS: dict[str, Callable[[Rank], None]] = {"subgroups": check_subgroups}

#: Scenarios of GPUs only (NCCL)
GPU_SCENARIOS: dict[str, Callable[[Rank], None]] = {}


def gpu_scenario(name: str):
    def register(check: Callable[[Rank], None]) -> Callable[[Rank], None]:
        GPU_SCENARIOS[name] = check
        return check

    return register


def gpu_backends() -> list[str]:
    """The GEMM backends this machine runs: Triton where it imports, DeepGEMM where it imports on SM90."""
    backends = ["triton"] if grouped_gemm.available() else []
    if torch.cuda.get_device_capability()[0] == 9 and _have_deep_gemm():
        backends.append("deep_gemm")
    return backends


@gpu_scenario("no sync low_latency")
def check_no_sync(r: Rank) -> None:
    """The low-latency dispatch and combine under torch.cuda.set_sync_debug_mode("error"): no call
    synchronizes with the device (after a warm-up call: the extension loads, NCCL connects)."""

    def run() -> torch.Tensor:
        sent = r.dispatch("low_latency", "masked")
        y = torch.zeros((*sent.q.shape[:-1], HIDDEN), dtype=torch.bfloat16, device=r.device)
        return ep_combine(y, sent.handle, r.mine(r.batch[2]))

    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu_scenario("graph low_latency")
def check_graph(r: Rank) -> None:
    """The low-latency layer on each GPU backend captured in a CUDA graph, replayed on other tokens
    (the batch's in reverse order): the eager layer's output, bit for bit."""
    w13, w2 = r.local_weights()
    for backend in gpu_backends():
        x, ids, weights = (r.mine(t).clone() for t in r.batch[:3])
        run = lambda: ep_moe_layer(x, ids, weights, w13, w2, group=r.group, max_tokens_per_rank=r.bound,
                                   backend=backend)  # fmt: skip
        run()  # warm-up: Triton compiles, NCCL connects
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        for t in (x, ids, weights):
            t.copy_(t.flip(0))
        graph.replay()
        torch.cuda.synchronize()
        assert_bits(out, run(), f"{backend}: the graph's output")


@gpu_scenario("layer gpu backends")
def check_gpu_backends(r: Rank) -> None:
    """The layer on each GPU backend, both modes and layouts: the reference backend's output up to
    the GEMMs' float32 summation order (calc_diff < 2e-5, the bar of test_moe_layer_gpu.py)."""
    x, ids, weights = (r.mine(t) for t in r.batch[:3])
    w13, w2 = r.local_weights()
    for backend in gpu_backends():
        for mode in ("normal", "low_latency"):
            for layout in ("contiguous", "masked"):
                kw = {"group": r.group, "mode": mode, "layout": layout,
                      "max_tokens_per_rank": r.bound if mode == "low_latency" else None}  # fmt: skip
                got = ep_moe_layer(x, ids, weights, w13, w2, backend=backend, **kw)
                want = ep_moe_layer(x, ids, weights, w13, w2, backend="reference", **kw)
                if x.shape[0]:
                    diff = calc_diff(got.float(), want.float())
                    assert diff < 2e-5, f"{backend} {mode} {layout}: calc_diff {diff:.2e}"


ALL_SCENARIOS = {**SCENARIOS, **WORLD4_SCENARIOS, **GPU_SCENARIOS}


# --- Processes -----------------------------------------------------------------------------------


def _worker(rank: int, world: int, store: str, out: str, device_type: str, names: list[str]) -> None:
    faulthandler.enable()  # a rank killed by a signal prints its threads' Python stacks
    torch.set_num_threads(1)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=TIMEOUT)  # fmt: skip
    failures: dict[str, str] = {}
    try:
        r = Rank(rank, world, device, idle_rank=IDLE_RANK[world])
        for name in names:
            try:
                ALL_SCENARIOS[name](r)
            except Exception:  # recorded: the parent reports it under the scenario's name
                failures[name] = traceback.format_exc()
    finally:
        # Record, then rename: the parent reads either nothing or the whole record
        Path(out, f"rank{rank}.part").write_text(json.dumps(failures))
        os.replace(Path(out, f"rank{rank}.part"), Path(out, f"rank{rank}.json"))
        # Tear down together: a rank that destroys its group while a peer still has collectives in
        # flight can abort that peer's transport threads (gloo: "terminate called without an
        # active exception", seen in CI)
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
    # Leave without finalizing the interpreter: its exit runs the communication backend's static
    # destructors, the one place left where a rank could abort after its work is done
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_world(world: int, device_type: str, names: list[str], tmp: Path) -> dict[str, str]:
    """Run the scenarios ``names`` (keys of :data:`ALL_SCENARIOS`) on ``world`` ranks of
    ``device_type`` tensors (gloo for "cpu", NCCL for "cuda": rank r on GPU r); returns, per
    scenario that failed, the failures of every rank it failed on."""
    store = tmp / "store"
    if store.exists():
        os.remove(store)
    ranks = mp.start_processes(_worker, args=(world, str(store), str(tmp), device_type, names), nprocs=world,
                               start_method="spawn", join=False)  # fmt: skip
    try:
        while not ranks.join():
            pass
    except mp.ProcessExitedException as e:
        # A rank ended without a Python exception (a signal or an exit status). Before every rank
        # recorded its scenarios, that is a failure; after, it is the backend's teardown (seen in
        # CI: gloo's "terminate called without an active exception"), which says nothing about
        # the scenarios: recorded as a warning
        if not all((tmp / f"rank{rank}.json").exists() for rank in range(world)):
            raise
        warnings.warn(f"world {world}: rank {e.error_index} died in teardown ({e}) after every rank "
                      "had recorded its scenarios", RuntimeWarning, stacklevel=2)  # fmt: skip
    failed: dict[str, str] = {}
    for rank in range(world):
        for name, text in json.loads((tmp / f"rank{rank}.json").read_text()).items():
            failed[name] = failed.get(name, "") + f"--- rank {rank}:\n{text}"
    return failed
