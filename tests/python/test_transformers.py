"""fp8quant.integrations.transformers on tiny random DeepSeek-V3 and Qwen3-MoE models on the CPU
(experts of 256 x 256, where the reference runs): quantize() writes fp8quant's weights into
transformers' FineGrainedFP8 modules, enable() runs them on fp8quant with no Hub access, each
module agrees with the format's floor (FP8 values, bf16 arithmetic) on the same input, and the
model's logits stay within 1.1x of the floor's distance to bf16. Skipped without transformers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

import fp8quant  # noqa: E402
from fp8quant.gemm import calc_diff  # noqa: E402
from fp8quant.integrations import transformers as fqt  # noqa: E402

VOCAB = 64
ARCHS = ("deepseek_v3", "qwen3_moe")


def tiny_model(arch: str, *, top_k: int = 8, seed: int = 0) -> nn.Module:
    """A 2-layer bf16 model (one dense layer, one MoE layer of 8 experts), weights N(0, 0.05).
    top_k = 8 sends every token to every expert, so that no routing decision flips between two
    numerics of the same model. kv_a_proj_with_mqa is 160 x 256 (N not a multiple of 128)."""
    torch.manual_seed(seed)
    if arch == "deepseek_v3":
        config = transformers.DeepseekV3Config(
            vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_hidden_layers=2,
            first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=8,
            num_experts_per_tok=top_k, n_shared_experts=1, n_group=1, topk_group=1, q_lora_rank=128, kv_lora_rank=128,
            qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=128,
        )  # fmt: skip
        model = transformers.DeepseekV3ForCausalLM(config)
    else:
        config = transformers.Qwen3MoeConfig(
            vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=128, num_experts=8, num_experts_per_tok=top_k,
            mlp_only_layers=[0], max_position_embeddings=128,
        )  # fmt: skip
        model = transformers.Qwen3MoeForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
    return model


def fp8_models(arch: str, **kwargs) -> tuple[nn.Module, nn.Module, nn.Module]:
    """(bf16 model, its format floor, the same model quantized and enabled)."""
    bf16 = tiny_model(arch, **kwargs)
    floor = fqt.format_floor(copy.deepcopy(bf16))
    enabled = fqt.enable(fqt.quantize(copy.deepcopy(bf16)))
    return bf16, floor, enabled


@pytest.mark.parametrize("arch", ARCHS)
def test_quantize_writes_fp8quant_weights(arch):
    bf16 = tiny_model(arch)
    model = fqt.quantize(copy.deepcopy(bf16))
    fg = fqt.finegrained_fp8()
    linears = experts = 0
    for name, module in model.named_modules():
        old = bf16.get_submodule(name)
        if isinstance(module, fg.FP8Linear):
            q, s = fp8quant.per_block_quant(old.weight.contiguous())
            assert torch.equal(module.weight.view(torch.uint8), q.view(torch.uint8)) and torch.equal(
                module.weight_scale_inv, s
            )
            linears += 1
        elif isinstance(module, fg.FP8Experts):
            for proj in ("gate_up_proj", "down_proj"):
                q, s = fp8quant.per_block_quant(getattr(old, proj).contiguous())
                assert torch.equal(getattr(module, proj).view(torch.uint8), q.view(torch.uint8))
                assert torch.equal(getattr(module, f"{proj}_scale_inv"), s)
            experts += 1
    assert linears == (16 if arch == "deepseek_v3" else 11) and experts == 1  # attention, dense and shared MLPs
    # The output embedding and the routers stay bf16
    assert type(model.lm_head) is nn.Linear and torch.equal(model.lm_head.weight, bf16.lm_head.weight)
    assert torch.equal(model.model.layers[1].mlp.gate.weight, bf16.model.layers[1].mlp.gate.weight)
    if arch == "deepseek_v3":  # N = 160: ceil-div scales, as DeepSeek-V3's 576 x 7168 kv_a_proj_with_mqa
        assert model.model.layers[0].self_attn.kv_a_proj_with_mqa.weight_scale_inv.shape == (2, 2)


@pytest.mark.parametrize("arch", ARCHS)
def test_enable_runs_every_fp8_matmul_on_fp8quant(arch):
    bf16 = tiny_model(arch)
    model = fqt.quantize(copy.deepcopy(bf16))
    fg = fqt.finegrained_fp8()
    fp8 = {name: m for name, m in model.named_modules() if isinstance(m, (fg.FP8Linear, fg.FP8Experts))}
    fqt.enable(model)
    gen = torch.Generator().manual_seed(1)
    for name, old in fp8.items():
        new = model.get_submodule(name)
        if isinstance(old, fg.FP8Linear):
            assert isinstance(new, fqt.FP8QuantLinear)
            x = torch.randn(5, 3, old.in_features, generator=gen).to(torch.bfloat16)
            want = fp8quant.linear(
                x, fp8quant.prepare_weight((old.weight, old.weight_scale_inv)), out_dtype=torch.bfloat16
            )
            assert torch.equal(new(x), want)
        else:
            assert new is old and model.config._experts_implementation == fqt.EXPERTS_IMPLEMENTATION
            x = torch.randn(9, old.hidden_dim, generator=gen).to(torch.bfloat16)
            ids = torch.stack([torch.randperm(8, generator=gen)[:3] for _ in range(9)])
            w = torch.rand(9, 3, generator=gen)
            w13 = fp8quant.prepare_experts(old.gate_up_proj, old.gate_up_proj_scale_inv)
            w2 = fp8quant.prepare_experts(old.down_proj, old.down_proj_scale_inv)
            assert torch.equal(new(x, ids, w), fp8quant.moe_layer(x, ids, w, w13, w2))


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_each_module_agrees_with_the_format_floor(arch):
    """The same input through each enabled module and its floor (FP8 values dequantized, activations
    quantized and dequantized per group, bf16 arithmetic): only the arithmetic differs."""
    _, floor, enabled = fp8_models(arch)
    gen = torch.Generator().manual_seed(2)
    checked = 0
    for name, module in enabled.named_modules():
        if isinstance(module, fqt.FP8QuantLinear):
            x = torch.randn(37, module.in_features, generator=gen).to(torch.bfloat16)
            assert calc_diff(module(x).float(), floor.get_submodule(name)(x).float()) < 1e-4, name
            checked += 1
        elif isinstance(module, fqt.finegrained_fp8().FP8Experts):
            x = torch.randn(37, module.hidden_dim, generator=gen).to(torch.bfloat16)
            ids = torch.stack([torch.randperm(8, generator=gen)[:4] for _ in range(37)])
            w = torch.rand(37, 4, generator=gen)
            assert calc_diff(module(x, ids, w).float(), floor.get_submodule(name)(x, ids, w).float()) < 1e-3, name
            checked += 1
    assert checked == (17 if arch == "deepseek_v3" else 12)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_within_the_format_floor(arch):
    bf16, floor, enabled = fp8_models(arch)
    ids = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref, low, got = (m(ids).logits.float() for m in (bf16, floor, enabled))
    assert torch.isfinite(got).all()
    floor_diff = calc_diff(low, ref)
    assert 1e-4 < floor_diff < 0.1  # the format costs something, and the model is not broken
    assert calc_diff(got, ref) <= 1.1 * floor_diff


def test_generate_offline(monkeypatch):
    """transformers' own FP8 forward needs a kernel from the Hub (ImportError offline); after
    enable(), generate() runs."""
    monkeypatch.setattr(fqt.finegrained_fp8(), "_FINEGRAINED_FP8", None)  # as before any enable()
    model = fqt.quantize(tiny_model("qwen3_moe", top_k=2))
    prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(4))
    try:
        import kernels  # noqa: F401, PLC0415
    except ImportError:
        with pytest.raises(ImportError, match="finegrained-fp8"):
            model(prompt)
    out = fqt.enable(model).generate(prompt, max_new_tokens=6, do_sample=False)
    assert out.shape == (1, 11) and torch.equal(out[:, :5], prompt)


def test_seam_matmuls():
    """The kernel seam (FineGrainedFP8): matmul, batched (rows by expert id; others 0) and grouped
    (rows sorted by expert, inclusive offsets; rows past them 0), each row equal to fp8quant.linear."""
    gen = torch.Generator().manual_seed(5)
    e, n, k = 3, 256, 384
    q, s = fp8quant.per_block_quant(torch.randn(e, n, k, generator=gen))
    x = torch.randn(7, k, generator=gen).to(torch.bfloat16)

    def rows(rows, expert):
        return fp8quant.linear(x[rows], (q[expert], s[expert]), out_dtype=torch.bfloat16)

    assert torch.equal(fqt.seam_matmul(x, q[1], s[1], [128, 128], torch.bfloat16), rows(slice(None), 1))
    expert_ids = torch.tensor([2, 0, 3, 2, 1, 0, 2])  # 3: a sentinel (another rank's expert)
    got = fqt.seam_batched_matmul(x, q, s, block_size=[128, 128], expert_ids=expert_ids)
    for expert in range(e):
        mine = (expert_ids == expert).nonzero(as_tuple=True)[0]
        assert torch.equal(got[mine], rows(mine, expert))
    assert not got[expert_ids == 3].any()
    got = fqt.seam_grouped_matmul(x, q, s, offsets=torch.tensor([2, 2, 5], dtype=torch.int32),
                                  tokens_per_expert=torch.tensor([2, 0, 3]), block_size=[128, 128])  # fmt: skip
    assert torch.equal(got[:2], rows(slice(0, 2), 0)) and torch.equal(got[2:5], rows(slice(2, 5), 2))
    assert not got[5:].any()
    with pytest.raises(NotImplementedError, match=r"^FineGrainedFP8.matmul: fp8quant runs 128 x 128 weight blocks"):
        fqt.seam_matmul(x, q[0], s[0], [64, 64], torch.bfloat16)


def test_refusals(monkeypatch):
    model = fqt.quantize(tiny_model("qwen3_moe"))
    proj = model.model.layers[0].self_attn.q_proj
    proj.block_size = (64, 64)
    with pytest.raises(NotImplementedError, match=r"^model.layers.0.self_attn.q_proj: fp8quant runs 128 x 128"):
        fqt.enable(model)
    with pytest.raises(ValueError, match=r"^moe_backend must be one of .*, got 'cutlass'$"):
        fqt.enable(model, moe_backend="cutlass")
    proj.block_size, proj.activation_scheme = (128, 128), "static"
    with pytest.raises(NotImplementedError, match=r"activation_scheme='dynamic'\), got 'static'$"):
        fqt.enable(model)
    from transformers.integrations import finegrained_fp8  # noqa: PLC0415

    monkeypatch.delattr(finegrained_fp8, "FineGrainedFP8")
    with pytest.raises(
        RuntimeError, match=r"lacks the FineGrainedFP8 names .*\(FineGrainedFP8\); tested with transformers 5\.17$"
    ):
        fqt.enable(model)


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_fused_norms(arch):
    """enable() fuses the RMSNorms that only FP8 linears read (one rms_norm_quant for all of them):
    the attention input norms, DeepSeek-V3's q_a norm and the dense layer's post-attention norm,
    not the MoE layer's (its router and experts read bf16) nor kv_a_layernorm (the KV cache
    reads it). The quantized rows are those of the model's own norm, quantized; the logits move
    by the norms' last-bit differences only."""
    bf16 = tiny_model(arch)
    unfused = fqt.enable(fqt.quantize(copy.deepcopy(bf16)), fuse_norms=False)
    fused = fqt.enable(fqt.quantize(copy.deepcopy(bf16)))
    names = sorted(n for n, m in fused.named_modules() if isinstance(m, fqt.FP8QuantRMSNorm))
    want = [
        "model.layers.0.input_layernorm",
        "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm",
    ]
    if arch == "deepseek_v3":
        want += ["model.layers.0.self_attn.q_a_layernorm", "model.layers.1.self_attn.q_a_layernorm"]
    assert names == sorted(want)
    gen = torch.Generator().manual_seed(6)
    for name in names:
        norm, ref_norm = fused.get_submodule(name), unfused.get_submodule(name)
        x = torch.randn(3, 11, norm.weight.shape[0], generator=gen).to(torch.bfloat16)
        got = norm(x)
        assert isinstance(got, fqt.QuantizedHidden) and got.shape == x.shape and got.dtype == x.dtype
        ref = fp8quant.reference.per_token_group_quant(ref_norm(x).reshape(-1, x.shape[-1]), 128,
                                                       scale_layout=norm.format.scale_layout, ue8m0=norm.format.ue8m0)  # fmt: skip
        same = (got.activation.q.view(torch.uint8) == ref[0].view(torch.uint8)).float().mean().item()
        assert same > 0.999, f"{name}: {same:.5f} of the bytes as the model's norm then the quantizer"
        with pytest.raises(RuntimeError, match="read by something other than the FP8 linears"):
            got + 1
    ids = torch.randint(0, VOCAB, (2, 33), generator=gen)
    assert calc_diff(fused(ids).logits.float(), unfused(ids).logits.float()) < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_fused_residual_adds(arch, monkeypatch):
    """enable() folds every residual add into the norm kernel that reads the sum: after attention
    into the post-attention norm (the dense layer's quantizing one, the MoE layer's bf16 one), at a
    layer's end into the next layer's input norm (the layer returns a PendingSum) or, after the
    last, the final norm. Each hidden state and the logits are the unfused model's up to the
    norms' last bits, also when a reader adds a PendingSum before the next layer does; a layer's
    input is never written; fuse_norms=False leaves the layers as transformers wrote them."""
    bf16 = tiny_model(arch)
    unfused = fqt.enable(fqt.quantize(copy.deepcopy(bf16)), fuse_norms=False)
    fused = fqt.enable(fqt.quantize(copy.deepcopy(bf16)))
    layers = [n for n, m in fused.named_modules() if "forward" in vars(m)]
    assert layers == ["model.layers.0", "model.layers.1"]
    assert not any("forward" in vars(m) for m in unfused.modules())
    assert isinstance(fused.model.layers[0].post_attention_layernorm, fqt.FP8QuantRMSNorm)
    assert isinstance(fused.model.layers[1].post_attention_layernorm, fqt.FusedAddRMSNorm)
    assert isinstance(fused.model.norm, fqt.FusedAddRMSNorm)
    assert fqt.fuse_residual_adds(fqt.quantize(copy.deepcopy(bf16))) == layers  # the norms need not be fused

    # Which kernels add, in order: layer 0's post-attention norm and layer 1's input norm
    # (quantizing), layer 1's post-attention norm and the final norm (bf16)
    adds = []
    for name in ("rms_norm", "rms_norm_quant"):
        real = getattr(fqt, name)
        monkeypatch.setattr(fqt, name, lambda *a, _real=real, _name=name, **k: (
            adds.append((_name, k.get("residual") is not None)), _real(*a, **k))[1])  # fmt: skip
    ids = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(7))
    got = fused(ids, output_hidden_states=True)
    assert [name for name, residual in adds if residual] == ["rms_norm_quant", "rms_norm_quant", "rms_norm", "rms_norm"]
    assert ("rms_norm", False) not in adds  # every bf16 norm adds; the quantizing ones without a residual: input
    # norm of layer 0, DeepSeek-V3's q_a norms
    ref = unfused(ids, output_hidden_states=True)
    assert len(got.hidden_states) == len(ref.hidden_states)
    for i, (a, b) in enumerate(zip(got.hidden_states, ref.hidden_states)):
        assert calc_diff(a.float(), b.float()) < 1e-4, f"hidden state {i}"
    assert calc_diff(got.logits.float(), ref.logits.float()) < 1e-4

    # A reader that adds layer 0's output first: the next layer takes that sum as it is
    early = []
    handle = fused.model.layers[0].register_forward_hook(lambda mod, args, out: early.append(out * 1))
    again = fused(ids, output_hidden_states=True)
    handle.remove()
    assert calc_diff(again.logits.float(), got.logits.float()) < 1e-6
    assert calc_diff(early[0].float(), ref.hidden_states[1].float()) < 1e-4

    # A layer's input stays as it was given
    layer = fused.model.layers[1]
    x = torch.randn(2, 33, bf16.config.hidden_size, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    before = x.clone()
    emb = fused.model.rotary_emb(x, torch.arange(33).unsqueeze(0))
    out = layer(x, position_embeddings=emb, position_ids=torch.arange(33).unsqueeze(0))
    assert isinstance(out, fqt.PendingSum) and torch.equal(x, before) and out.shape == x.shape
    assert calc_diff(out.float(), unfused.model.layers[1](x, position_embeddings=emb,
                                                          position_ids=torch.arange(33).unsqueeze(0)).float()) < 1e-4  # fmt: skip
