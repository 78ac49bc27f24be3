"""``python -m fp8quant bench --model deepseek-v3|qwen3-moe``: a transformers model of the real
per-layer dims with random weights, built offline, run in FP8 on fp8quant
(:mod:`fp8quant.integrations.transformers`: ``quantize`` then ``enable``) against the same weights
in bf16:

- prefill: one sequence of T tokens (``--m``, default 512, 2048 and 8192), eager (host work
  included: every op launched from Python) and replayed as a CUDA graph (what an engine that
  captures prefill graphs runs; the row is left out where capture fails);
- decode: one step at batch 1, 8 and 64 with a static KV cache holding PROMPT tokens, replayed as
  a CUDA graph (eager where capture fails, and marked so);
- accuracy: the logits' calc_diff against bf16 on ACCURACY_T tokens, beside the format's own
  floor (:func:`fp8quant.integrations.transformers.format_floor`: the same FP8 values, bf16
  arithmetic).

``--layers N`` decoder layers (default 4: the first dense, the others MoE), vocabulary VOCAB.
Without a GPU: tiny dims on the CPU (the reference), timed eagerly, and said so.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import time

import torch

from ..gemm import calc_diff

MODELS = ("deepseek-v3", "qwen3-moe")
PREFILL_T = (512, 2048, 8192)
DECODE_BATCH = (1, 8, 64)
PROMPT = 128  # tokens in the cache before the timed decode step
ACCURACY_T = 512
VOCAB = 32000
LAYERS = 4
WARMUP, RUNS = 2, 5
WARMUP_S = 0.5  # and at least this long: lazy module loads, caches and GPU clocks settle first

# Tiny dims for the CPU run: experts of 256 x 256 (the reference's GEMMs take 128-wide blocks)
CPU_PREFILL_T, CPU_DECODE_BATCH, CPU_PROMPT, CPU_VOCAB, CPU_LAYERS = (32, 64), (1, 2), 16, 64, 2


def model_config(name: str, layers: int, tiny: bool):
    """The transformers config of ``name`` at its real per-layer dims (``tiny``: small ones)."""
    import transformers  # noqa: PLC0415

    vocab = CPU_VOCAB if tiny else VOCAB
    if name == "deepseek-v3":  # DeepSeek-V3's layer, 64 routed experts
        dims = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_attention_heads=128,
                    num_key_value_heads=128, n_routed_experts=64, n_group=8, topk_group=4, q_lora_rank=1536,
                    kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)  # fmt: skip
        if tiny:
            dims = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_attention_heads=2,
                        num_key_value_heads=2, n_routed_experts=8, n_group=1, topk_group=1, q_lora_rank=128,
                        kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64)  # fmt: skip
        return transformers.DeepseekV3Config(vocab_size=vocab, num_hidden_layers=layers, first_k_dense_replace=1,
                                             num_experts_per_tok=8, n_shared_experts=1, max_position_embeddings=16384,
                                             **dims)  # fmt: skip
    if name == "qwen3-moe":  # Qwen3-30B-A3B's layer
        dims = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
                    num_key_value_heads=4, head_dim=128, num_experts=128)  # fmt: skip
        if tiny:
            dims = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=128, num_experts=8)  # fmt: skip
        return transformers.Qwen3MoeConfig(vocab_size=vocab, num_hidden_layers=layers, num_experts_per_tok=8,
                                           mlp_only_layers=[0], max_position_embeddings=16384, **dims)  # fmt: skip
    raise SystemExit(f"--model must be one of {', '.join(MODELS)}, got {name!r}")


def build(
    name: str, layers: int, device: torch.device, tiny: bool, *, backend: str = "auto", moe_backend: str = "auto"
):
    """(bf16 model, its format floor, the same weights in FP8 on fp8quant), random weights; the
    FP8 model's GEMMs on ``backend`` and ``moe_backend`` (:func:`fp8quant.integrations.transformers.enable`)."""
    import transformers  # noqa: PLC0415

    from ..integrations import transformers as fp8quant_tf  # noqa: PLC0415

    config = model_config(name, layers, tiny)
    cls = transformers.DeepseekV3ForCausalLM if name == "deepseek-v3" else transformers.Qwen3MoeForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        bf16 = cls(config).to(torch.bfloat16).eval()
    floor = fp8quant_tf.format_floor(copy.deepcopy(bf16))
    fp8 = fp8quant_tf.enable(fp8quant_tf.quantize(copy.deepcopy(bf16)), backend=backend, moe_backend=moe_backend)
    return bf16, floor, fp8


class Timer:
    """Milliseconds of a call: CUDA events on the GPU, the wall clock on the CPU (synchronized)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def ms(self, call, *, settle: bool = True) -> float:
        """Median of RUNS calls after WARMUP calls, and with ``settle`` after WARMUP_S seconds of
        them (not for calls that must run a fixed number of times, like eager decode steps
        filling a cache)."""
        start = time.perf_counter()
        for i in itertools.count(1):
            call()
            if self.cuda:
                torch.cuda.synchronize()
            if i >= WARMUP and (not settle or time.perf_counter() - start >= WARMUP_S):
                break
        times = []
        for _ in range(RUNS):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


@torch.no_grad()
def prefill_ms(model, t: int, vocab: int, timer: Timer, device: torch.device) -> tuple[float, float | None]:
    """One forward over a sequence of ``t`` tokens: (eager ms, ms as a replayed CUDA graph or
    None where it is not captured: on the CPU, or where capture fails)."""
    ids = torch.randint(0, vocab, (1, t), device=device)

    def forward():
        return model(input_ids=ids, use_cache=False).logits

    eager = timer.ms(forward)
    return eager, replayed_ms(forward, timer, device, f"prefill at T={t}")


def replayed_ms(call, timer: Timer, device: torch.device, what: str, *, settle: bool = True) -> float | None:
    """``call`` (already run eagerly: JIT compilation and allocations done) captured in a CUDA
    graph and timed as replays (``settle`` as in :meth:`Timer.ms`); None on the CPU or when
    capture fails (said so)."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        ms = timer.ms(graph.replay, settle=settle)
    except RuntimeError as e:
        print(f"  {what} did not capture in a CUDA graph ({str(e).splitlines()[0]})", flush=True)
        torch.cuda.synchronize()
        return None
    del graph  # its memory pool goes back before the next shape
    return ms


@torch.no_grad()
def decode_ms(model, batch: int, prompt: int, vocab: int, timer: Timer, device: torch.device) -> tuple[float, bool]:
    """One decode step with a static cache of ``prompt`` tokens: (ms, replayed as a CUDA graph)."""
    import transformers  # noqa: PLC0415

    # Room past the prompt for every timed step: a step may take its position from the cache's
    # length rather than from cache_position (a replayed graph repeats its captured one)
    cache = transformers.StaticCache(config=model.config, max_cache_len=prompt + 4 * (WARMUP + RUNS))
    model(input_ids=torch.randint(0, vocab, (batch, prompt), device=device), past_key_values=cache, use_cache=True)
    token = torch.randint(0, vocab, (batch, 1), device=device)
    position = torch.tensor([prompt], device=device)

    def step():
        return model(input_ids=token, past_key_values=cache, cache_position=position, use_cache=True).logits

    if device.type == "cuda":
        for _ in range(WARMUP):  # JIT compilation and allocations before the capture
            step()
        # A replayed step writes the cache at the next position on the device (transformers takes
        # it from the cache's length there): a fixed number of replays, within the room above
        ms = replayed_ms(step, timer, device, f"decode at batch {batch}", settle=False)
        if ms is not None:
            return ms, True
        print("  timed eagerly instead", flush=True)
    return timer.ms(step, settle=False), False


@torch.no_grad()
def logits_diffs(bf16, floor, fp8, t: int, vocab: int, device: torch.device) -> tuple[float, float]:
    """calc_diff against bf16 of fp8quant's logits and of the floor's, on one sequence of t tokens."""
    ids = torch.randint(0, vocab, (1, t), generator=torch.Generator(device=device).manual_seed(1), device=device)
    ref = bf16(input_ids=ids, use_cache=False).logits.float()
    return (calc_diff(fp8(input_ids=ids, use_cache=False).logits.float(), ref),
            calc_diff(floor(input_ids=ids, use_cache=False).logits.float(), ref))  # fmt: skip


def run_model(args: argparse.Namespace) -> int:
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    tiny = device.type == "cpu"
    layers = args.layers if args.layers is not None else (CPU_LAYERS if tiny else LAYERS)
    if layers < 2:
        raise SystemExit(f"--layers must be >= 2 (the first layer is dense, the others MoE), got {layers}")
    prefill = args.m or (CPU_PREFILL_T if tiny else PREFILL_T)[: 1 if args.quick else None]
    batches = (CPU_DECODE_BATCH if tiny else DECODE_BATCH)[: 1 if args.quick else None]
    prompt, vocab = (CPU_PROMPT, CPU_VOCAB) if tiny else (PROMPT, VOCAB)
    if tiny:
        print("no CUDA GPU: tiny dims on the CPU (fp8quant's reference numerics), eager wall-clock times", flush=True)
    print(f"building {args.model}, {layers} layers (bf16, its format floor, and fp8quant's FP8)", flush=True)
    bf16, floor, fp8 = build(args.model, layers, device, tiny)
    timer = Timer(device)
    rows = []
    steps = len(prefill) + len(batches) + 1
    graphed = []
    for i, t in enumerate(prefill, 1):
        print(f"[{i}/{steps}] prefill T={t}", flush=True)
        (eager_bf16, graph_bf16), (eager_fp8, graph_fp8) = (prefill_ms(m, t, vocab, timer, device) for m in (bf16, fp8))
        rows.append((f"prefill T={t}", eager_bf16, eager_fp8, "eager"))
        if graph_bf16 is not None and graph_fp8 is not None:
            graphed.append((f"prefill T={t}", graph_bf16, graph_fp8, "CUDA graph"))
    rows += graphed
    for i, b in enumerate(batches, len(prefill) + 1):
        print(f"[{i}/{steps}] decode batch {b}", flush=True)
        ms_bf16, graphed_bf16 = decode_ms(bf16, b, prompt, vocab, timer, device)
        ms_fp8, graphed_fp8 = decode_ms(fp8, b, prompt, vocab, timer, device)
        how = {(True, True): "CUDA graphs", (False, False): "eager"}.get((graphed_bf16, graphed_fp8), "bf16 "
              + ("graph" if graphed_bf16 else "eager") + ", fp8quant " + ("graph" if graphed_fp8 else "eager"))  # fmt: skip
        rows.append((f"decode step, batch {b}", ms_bf16, ms_fp8, how))
    print(f"[{steps}/{steps}] logits on {min(ACCURACY_T, 4 * prompt)} tokens", flush=True)
    ours, floor_diff = logits_diffs(bf16, floor, fp8, min(ACCURACY_T, 4 * prompt), vocab, device)
    where = "CPU (tiny dims)" if tiny else torch.cuda.get_device_name(device)
    lines = [f"### {args.model}, {layers} layers, {where}: fp8quant's FP8 against bf16", "",
             "| measurement | bf16 ms | fp8quant ms | speedup | timed |", "|---|--:|--:|--:|---|"]  # fmt: skip
    lines += [f"| {name} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {how or 'eager'} |" for name, a, b, how in rows]
    lines += ["", f"Logits calc_diff against bf16: fp8quant {ours:.3e}, the format floor {floor_diff:.3e} "
              f"({ours / floor_diff:.2f}x the floor)."]  # fmt: skip
    table = "\n".join(lines)
    print(table, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
        print(f"wrote {args.markdown}")
    if args.json:
        results = [{"measurement": n, "bf16_ms": a, "fp8quant_ms": b, "timed": h or "eager"} for n, a, b, h in rows]
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "layers": layers, "device": where, "results": results,
                       "calc_diff": {"fp8quant": ours, "floor": floor_diff}}, f, indent=1)  # fmt: skip
        print(f"wrote {args.json}")
    return 0
