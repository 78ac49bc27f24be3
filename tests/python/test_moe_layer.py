"""fp8quant.moe_layer and MoELayer on the CPU (the reference backend): the layer against the
unquantized float32 layer, both layouts equal, expert parallelism by expert_offset, the layout
policy and the argument checks. The GPU backends are tested in test_moe_layer_gpu.py."""

from __future__ import annotations

import pytest
import torch

import fp8quant
from fp8quant.gemm import calc_diff
from fp8quant.grouped_gemm import kernel_config
from fp8quant.moe_layer import AUTO_PLAN, LAYOUT_BY_TOKENS, choose_layout, moe_layer_bf16, plan, segment_align


def layer_inputs(t, h=256, inter=256, e=8, k=2, seed=0, device="cpu"):
    """Tokens, top-k routing of a softmax router, and bf16 expert weights scaled like a trained
    layer's (unit-variance outputs)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, h, generator=gen, device=device).to(torch.bfloat16)
    w13 = (torch.randn(e, 2 * inter, h, generator=gen, device=device) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, inter, generator=gen, device=device) / inter**0.5).to(torch.bfloat16)
    logits = torch.randn(t, e, generator=gen, device=device)
    weights, ids = torch.topk(logits.softmax(-1), k)
    return x, ids.to(torch.int32), weights, w13, w2


@pytest.mark.parametrize("t", [1, 5, 64])
def test_reference_layer_against_unquantized(t):
    x, ids, weights, w13, w2 = layer_inputs(t)
    q13, q2 = fp8quant.prepare_experts(w13), fp8quant.prepare_experts(w2)
    want = moe_layer_bf16(x, ids, weights, w13, w2)
    outs = [fp8quant.moe_layer(x, ids, weights, q13, q2, layout=layout) for layout in ("contiguous", "masked")]
    assert outs[0].dtype == torch.bfloat16 and outs[0].shape == x.shape
    assert torch.equal(outs[0], outs[1])  # the same rows through either layout, the same GEMM per row
    assert calc_diff(outs[0].float(), want) < 4e-3  # four e4m3 roundings on the way (GPU tests: the bar)
    layer = fp8quant.MoELayer(q13, q2, layout="masked")
    assert torch.equal(layer(x, ids, weights), outs[0])
    assert "experts=8" in repr(layer)


def test_expert_parallel_ranks_add_up():
    """Two ranks holding experts 0-3 and 4-7 give, summed, the single-rank layer."""
    x, ids, weights, w13, w2 = layer_inputs(33)
    whole = fp8quant.moe_layer(x, ids, weights, fp8quant.prepare_experts(w13), fp8quant.prepare_experts(w2))
    parts = [
        fp8quant.moe_layer(x, ids, weights, fp8quant.prepare_experts(w13[r : r + 4]),
                           fp8quant.prepare_experts(w2[r : r + 4]), expert_offset=r).float()
        for r in (0, 4)
    ]  # fmt: skip
    assert calc_diff(parts[0] + parts[1], whole.float()) < 1e-5  # one bf16 rounding each


def test_dropped_slots_and_no_tokens():
    x, ids, weights, w13, w2 = layer_inputs(6)
    q13, q2 = fp8quant.prepare_experts(w13), fp8quant.prepare_experts(w2)
    ids[0] = -1  # token 0 goes nowhere
    out = fp8quant.moe_layer(x, ids, weights, q13, q2)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    empty = fp8quant.moe_layer(x[:0], ids[:0], weights[:0], q13, q2)
    assert empty.shape == (0, x.shape[1])


def test_checkpoint_weights_are_kept():
    _, _, _, w13, _ = layer_inputs(1)
    q, s = fp8quant.per_block_quant(w13)
    prepared = fp8quant.prepare_experts(q, s)
    assert prepared.q is q or torch.equal(prepared.q.view(torch.uint8), q.view(torch.uint8))
    with pytest.raises(ValueError, match=r"needs its block scales w_scale: float32 \(8, 4, 2\)"):
        fp8quant.prepare_experts(q)
    assert torch.equal(fp8quant.prepare_experts(q, w_scale=s).scale, s)
    # scale: w_scale's deprecated name, for one release
    with pytest.warns(DeprecationWarning, match=r"^prepare_experts\(scale=\.\.\.\) is deprecated: pass w_scale"):
        assert torch.equal(fp8quant.prepare_experts(q, scale=s).scale, s)
    with (
        pytest.raises(TypeError, match=r"^pass w_scale only: scale is its deprecated name$"),
        pytest.warns(DeprecationWarning),
    ):
        fp8quant.prepare_experts(q, s, scale=s)
    with pytest.raises(ValueError, match=r"K a positive multiple of 128"):
        fp8quant.prepare_experts(torch.ones(2, 128, 100))


def test_layout_policy():
    for backend, table in LAYOUT_BY_TOKENS.items():
        assert table[-1][0] == float("inf")
        assert [b for b, _ in table] == sorted(b for b, _ in table)
        for t in (1, 16, 128, 4096, 10**6):
            assert choose_layout(t, backend) in ("contiguous", "masked")
            assert plan(t, backend) == (backend, choose_layout(t, backend))
            assert plan(t, backend, "masked") == (backend, "masked")
    assert AUTO_PLAN[-1][0] == float("inf")
    for t in (1, 16, 128, 4096, 10**6):
        backend, layout = plan(t)
        assert (backend, layout) in {(b, lay) for _, b, lay in AUTO_PLAN}
        assert plan(t, "auto", "contiguous") == (backend, "contiguous")


@pytest.mark.parametrize(
    "change,error,match",
    [
        ({"x": torch.ones(4, 256)}, TypeError, r"^x must be a bfloat16 tensor"),
        ({"topk_ids": torch.zeros(3, 2, dtype=torch.int32)}, ValueError, r"^topk_ids has 3 tokens, x 4$"),
        ({"topk_weights": torch.ones(4, 3)}, ValueError, r"^topk_weights must be a float tensor of topk_ids' shape"),
        ({"layout": "ragged"}, ValueError, r"^layout must be one of"),
        ({"backend": "cutlass"}, ValueError, r"^backend must be one of"),
        ({"backend": "triton"}, ValueError, r"needs CUDA tensors"),
        ({"expert_offset": -1}, ValueError, r"^expert_offset must be an int >= 0"),
        ({"w2": "swap"}, ValueError, r"^w2 must be \[E, H, I\]"),
    ],
)  # fmt: skip
def test_argument_errors(change, error, match):
    x, ids, weights, w13, w2 = layer_inputs(4)
    q13, q2 = fp8quant.prepare_experts(w13), fp8quant.prepare_experts(w2)
    args = {"x": x, "topk_ids": ids, "topk_weights": weights, "w13": q13, "w2": q2}
    if change.get("w2") == "swap":
        change = {"w2": fp8quant.prepare_experts(w2[:, :128].transpose(1, 2).contiguous().repeat(1, 2, 1))}
    args.update(change)
    with pytest.raises(error, match=match):
        fp8quant.moe_layer(**args)


def _ffn_inputs(layout: str):
    """expert_ffn's operands for 4 tokens of layer_inputs, dispatched in ``layout``."""
    x, ids, _, w13, w2 = layer_inputs(4)
    routing = fp8quant.moe_routing(ids, 8, max_m=4 if layout == "masked" else None)
    q, scale = fp8quant.moe_dispatch_quant(x, routing, layout=layout, max_m=4 if layout == "masked" else None)
    return q, scale, routing, fp8quant.prepare_experts(w13), fp8quant.prepare_experts(w2)


@pytest.mark.parametrize(
    "layout, change, error, match",
    [
        ("contiguous", {"q": [1]}, TypeError, r"^q must be a float8_e4m3fn tensor \[rows, H\] for layout='contiguous', got list$"),
        ("contiguous", {"q": "float"}, TypeError, r"^q must be a float8_e4m3fn tensor \[rows, H\] for layout='contiguous', "
                                                  r"got torch.float32 of shape"),
        ("masked", {"q": "flat"}, TypeError, r"^q must be a float8_e4m3fn tensor \[E, max_m, H\] for layout='masked', got"),
        ("contiguous", {"scale": None}, TypeError, r"^scale must be a float32 tensor \(q's mn_tma scales\), got NoneType$"),
        ("contiguous", {"scale": "row"}, ValueError, r"^scale must have shape \(512, 2\) and strides \(1, 512\) for layout 'mn_tma', got \(512, 2\) and \(2, 1\)$"),
        ("contiguous", {"scale": "short"}, ValueError, r"^scale must have shape \(512, 2\) \(q's rows, H / 128 groups\), got \(512, 1\)$"),
        ("contiguous", {"routing": "tuple"}, TypeError, r"^routing must be fp8quant.moe_routing's result \(a MoeRouting\), got tuple$"),
        ("masked", {"routing": None}, TypeError, r"^routing must be fp8quant.moe_routing's result \(a MoeRouting\), got NoneType$"),
        ("contiguous", {"w13": "tensor"}, TypeError, r"^w13 must be an ExpertWeights \(fp8quant.prepare_experts\), got Tensor$"),
        ("masked", {"w2": (1, 2)}, TypeError, r"^w2 must be an ExpertWeights \(fp8quant.prepare_experts\), got tuple$"),
        ("contiguous", {"q": "narrow"}, ValueError, r"^w13 is \[E, 2I, H\] = \(8, 512, 256\), but q has H = 128$"),
    ],
)  # fmt: skip
def test_expert_ffn_argument_errors(layout, change, error, match):
    """expert_ffn names its own arguments (a list, a plain tuple as routing raised AttributeError;
    other mistakes surfaced as the grouped GEMM's a[0] / a[1] (a_s))."""
    q, scale, routing, w13, w2 = _ffn_inputs(layout)
    args = {"q": q, "scale": scale, "routing": routing, "w13": w13, "w2": w2}
    special = {
        "float": lambda: q.float(),
        "flat": lambda: q.flatten(0, 1),
        "row": lambda: scale.contiguous(),
        "short": lambda: scale[:, :1],
        "tuple": lambda: tuple(routing),
        "tensor": lambda: w13.q,
        "narrow": lambda: q[:, :128],
    }
    args.update({k: special[v]() if isinstance(v, str) else v for k, v in change.items()})
    with pytest.raises(error, match=match):
        fp8quant.expert_ffn(args.pop("q"), args.pop("scale"), args.pop("routing"), **args, layout=layout)


def test_module_checks_its_weights():
    """MoELayer checks the weights and expert_offset when built, not at the first forward (a tensor
    for w13 raised AttributeError on w13.q)."""
    _, _, _, w13, w2 = _ffn_inputs("contiguous")
    with pytest.raises(TypeError, match=r"^w13 must be an ExpertWeights \(fp8quant.prepare_experts\), got Tensor$"):
        fp8quant.MoELayer(torch.randn(2), w2)
    with pytest.raises(ValueError, match=r"^w2 must be \[E, H, I\] = \(8, 256, 256\) for w13"):
        fp8quant.MoELayer(w13, w13)
    for offset in (-1, 1.5, None):
        with pytest.raises(ValueError, match=rf"^expert_offset must be an int >= 0, got {offset!r}$"):
            fp8quant.MoELayer(w13, w2, expert_offset=offset)
    assert fp8quant.MoELayer(w13, w2, expert_offset=8).expert_offset == 8


def test_segment_align_follows_the_gemm_tiles():
    """The Triton GEMM's contiguous segments are padded to its tile height, so no tile is all
    padding; DeepGEMM's and every masked layout keep 128."""
    for expected_m, rows in ((1, 16), (16, 16), (17, 64), (64, 64), (65, 128), (4096, 128)):
        assert (
            segment_align("triton", "contiguous", expected_m)
            == rows
            == kernel_config(expected_m, contiguous=True).block_m
        )
        for backend, layout in (
            ("triton", "masked"),
            ("deep_gemm", "contiguous"),
            ("deep_gemm", "masked"),
            ("reference", "contiguous"),
        ):
            assert segment_align(backend, layout, expected_m) == 128
