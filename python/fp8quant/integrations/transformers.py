"""fp8quant in Hugging Face transformers' FineGrainedFP8 models (DeepSeek-style 128 x 128 FP8
weights, 1 x 128 activation groups), with nothing fetched from the Hub.

A model that transformers loaded and quantized::

    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=FineGrainedFP8Config(),
                                                 device_map="cuda")
    fp8quant.integrations.transformers.enable(model)

or a bfloat16 model quantized once from its own weights (transformers' loader casts bf16 to fp8
before it quantizes: two roundings)::

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, device_map="cuda")
    fp8quant.integrations.transformers.quantize(model)   # FineGrainedFP8's modules, fp8quant's weights
    fp8quant.integrations.transformers.enable(model)

:func:`enable` runs every FP8 linear through :func:`fp8quant.linear` (weights prepared once for the
backend), the routed experts through :func:`fp8quant.moe_layer` (the ``"fp8quant"`` experts
implementation), the RMSNorms that only FP8 linears read through :func:`fp8quant.rms_norm_quant`
(one quantized activation for all their readers), folds every residual add of the decoder layers
into the norm kernel that reads the sum, and plugs fp8quant into transformers' kernel
seam, so that any other FP8 matmul of the model runs on fp8quant too. Tested with transformers 5.17 (``TESTED_VERSIONS``); a
transformers without the seam gets a RuntimeError that says so.
"""

from __future__ import annotations

from types import MethodType, ModuleType

import torch
from torch import nn

from .. import reference
from ..gemm import QuantizedActivation, QuantizedWeight, linear, prepare_weight
from ..moe_layer import ExpertWeights, moe_layer, prepare_experts
from ..norm import rms_norm, rms_norm_quant
from ..weights import per_block_quant

TESTED_VERSIONS = ("5.17",)
EXPERTS_IMPLEMENTATION = "fp8quant"
MOE_BACKENDS = ("auto", "deep_gemm", "triton", "reference")
BLOCK = (128, 128)
_SEAM = ("FineGrainedFP8", "FP8Linear", "FP8Experts", "FP8ExpertsInterface", "replace_with_fp8_linear")


def finegrained_fp8() -> ModuleType:
    """transformers' ``integrations.finegrained_fp8`` module, checked for the names fp8quant plugs
    into; ImportError without transformers, RuntimeError when a name is missing."""
    try:
        import transformers  # noqa: PLC0415
        from transformers.integrations import finegrained_fp8 as fg  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(
            f"fp8quant.integrations.transformers needs transformers (tested: {', '.join(TESTED_VERSIONS)}): {e}"
        ) from e
    missing = [name for name in (*_SEAM, "_FINEGRAINED_FP8") if not hasattr(fg, name)]
    if missing:
        raise RuntimeError(
            f"transformers {transformers.__version__} lacks the FineGrainedFP8 names fp8quant plugs into "
            f"({', '.join(missing)}); tested with transformers {', '.join(TESTED_VERSIONS)}"
        )
    return fg


def _check_block(block_size, where: str) -> None:
    if block_size is None or tuple(block_size) != BLOCK:
        raise NotImplementedError(f"{where}: fp8quant runs 128 x 128 weight blocks, got block_size={block_size}")


def _check_dynamic(scheme: str, where: str) -> None:
    if scheme != "dynamic":
        raise NotImplementedError(f"{where}: fp8quant quantizes activations per group (activation_scheme='dynamic'), "
                                  f"got {scheme!r}")  # fmt: skip


def _check_scale(scale: torch.Tensor, where: str) -> None:
    if scale.dtype != torch.float32:
        raise NotImplementedError(f"{where}: fp8quant reads float32 block scales (weight_scale_inv), got {scale.dtype}")


# --- quantize: a bf16 model to FineGrainedFP8's modules, with fp8quant's weights --------------------

NOT_CONVERTED = ("lm_head", "gate", "router")  # the output embedding and the routers stay bf16


def convertible(model: nn.Module, modules_to_not_convert=NOT_CONVERTED) -> list[tuple[str, nn.Module]]:
    """The modules transformers' FineGrainedFP8 replaces (``replace_with_fp8_linear``'s rule):
    every exact ``nn.Linear`` and every ``*.experts`` module, but those matching
    ``modules_to_not_convert`` (transformers' name patterns)."""
    from transformers.quantizers.quantizers_utils import should_convert_module  # noqa: PLC0415

    patterns = list(modules_to_not_convert)
    return [(name, module) for name, module in model.named_modules()
            if should_convert_module(name, patterns) and (name.endswith(".experts") or type(module) is nn.Linear)]  # fmt: skip


def quantize(model: nn.Module, *, modules_to_not_convert=NOT_CONVERTED) -> nn.Module:
    """Turn a bfloat16 model into transformers' FineGrainedFP8 form in place, each weight quantized
    once from its bf16 values by :func:`fp8quant.per_block_quant` (128 x 128 blocks, ceil-div
    scales for dims that are not multiples of 128): every ``nn.Linear`` becomes an ``FP8Linear``
    and every ``*.experts`` module an ``FP8Experts``, as transformers' FineGrainedFP8 quantizer
    lays them out (:func:`convertible`). ``modules_to_not_convert`` (transformers' name patterns)
    stay as they are: by default the output embedding (``lm_head``) and the routers (``*.gate``,
    ``*.router``). Returns the model."""
    fg = finegrained_fp8()
    from transformers import FineGrainedFP8Config  # noqa: PLC0415

    before = dict(convertible(model, modules_to_not_convert))
    fg.replace_with_fp8_linear(model, modules_to_not_convert=list(modules_to_not_convert),
                               quantization_config=FineGrainedFP8Config(weight_block_size=BLOCK))  # fmt: skip
    for name, module in model.named_modules():
        old = before.get(name)
        if old is None or old is module:
            continue
        if isinstance(module, fg.FP8Linear):
            _set_quantized(module, "weight", "weight_scale_inv", old.weight)
            if old.bias is not None:
                module.bias = nn.Parameter(old.bias.detach(), requires_grad=False)
        elif isinstance(module, fg.FP8Experts):
            for proj in ("gate_up_proj", "up_proj", "down_proj"):
                if hasattr(module, f"{proj}_scale_inv"):
                    _set_quantized(module, proj, f"{proj}_scale_inv", getattr(old, proj))
    return model


def _set_quantized(module: nn.Module, weight: str, scale: str, w: torch.Tensor) -> None:
    q, s = per_block_quant(w.detach().contiguous(), BLOCK)
    setattr(module, weight, nn.Parameter(q, requires_grad=False))
    setattr(module, scale, nn.Parameter(s, requires_grad=False))


# --- the format's own floor: FP8 values, bf16 arithmetic ----------------------------------------------

FLOOR_EXPERTS_IMPLEMENTATION = "fp8quant_floor"


def _qdq(x: torch.Tensor) -> torch.Tensor:
    """x quantized per 1 x 128 group (fp32 scales) and dequantized, in x's dtype."""
    q, scale, _ = reference.quantize_groups(x, 128, ue8m0=False, eps=1e-10)
    return reference.dequantize_groups(q, scale).to(x.dtype)


def _dequantized(w: torch.Tensor) -> torch.Tensor:
    """w's FP8 values (:func:`fp8quant.per_block_quant`, 128 x 128 blocks), dequantized, in w's dtype."""
    return reference.dequantize_blocks(*per_block_quant(w.detach().contiguous(), BLOCK)).to(w.dtype)


def floor_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The ``"fp8quant_floor"`` experts implementation (:func:`format_floor`): each expert's
    bf16 matmuls on activations quantized and dequantized per group."""
    out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    for e in torch.unique(top_k_index).tolist():
        if not 0 <= e < self.gate_up_proj.shape[0]:
            continue
        token, slot = (top_k_index == e).nonzero(as_tuple=True)
        h = self._apply_gate(nn.functional.linear(_qdq(hidden_states[token]), self.gate_up_proj[e]))
        y = nn.functional.linear(_qdq(h), self.down_proj[e])
        out.index_add_(0, token, y.float() * top_k_weights[token, slot, None].float())
    return out.to(hidden_states.dtype)


def format_floor(model: nn.Module, *, modules_to_not_convert=NOT_CONVERTED) -> nn.Module:
    """The FP8 format's own floor of a bfloat16 model, in place: what :func:`quantize` converts
    (:func:`convertible`) keeps its bf16 modules and arithmetic, but its weights become their FP8
    values dequantized and the activations entering them are quantized and dequantized per 1 x 128
    group (for the experts, both matmuls' inputs: the ``"fp8quant_floor"`` experts
    implementation). The accuracy an FP8 model can reach; the oracle of the integration's tests
    and of its benchmark. Returns the model."""
    from transformers.integrations.moe import ExpertsInterface  # noqa: PLC0415

    ExpertsInterface.register(FLOOR_EXPERTS_IMPLEMENTATION, floor_experts_forward)
    experts = False
    for _, module in convertible(model, modules_to_not_convert):
        if type(module) is nn.Linear:
            module.weight.data = _dequantized(module.weight)
            module.register_forward_pre_hook(lambda mod, args: (_qdq(args[0]), *args[1:]))
        else:
            for proj in ("gate_up_proj", "up_proj", "down_proj"):
                if isinstance(getattr(module, proj, None), torch.Tensor):
                    getattr(module, proj).data = _dequantized(getattr(module, proj))
            experts = True
    if experts:
        model.set_experts_implementation(FLOOR_EXPERTS_IMPLEMENTATION)
    return model


# --- enable: the model's FP8 matmuls on fp8quant -----------------------------------------------------


class FP8QuantLinear(nn.Module):
    """An ``FP8Linear`` run by :func:`fp8quant.linear`: its weight prepared once for ``backend``
    (the checkpoint's fp8 weight and float32 ``weight_scale_inv``, used as they are where the
    backend reads them so), activations quantized per 1 x 128 group on each call."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None, in_features: int, out_features: int):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.in_features, self.out_features = in_features, out_features

    @classmethod
    def from_fp8_linear(cls, module: nn.Module, backend: str, where: str) -> FP8QuantLinear:
        _check_block(module.block_size, where)
        _check_dynamic(module.activation_scheme, where)
        _check_scale(module.weight_scale_inv, where)
        weight = prepare_weight((module.weight.detach(), module.weight_scale_inv.detach()), backend)
        bias = None if module.bias is None else module.bias.detach()
        return cls(weight, bias, module.in_features, module.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, QuantizedHidden):  # a fused norm's output: already quantized in this weight's format
            y = linear(x.activation, self.weight, out_dtype=x.dtype).unflatten(0, x.shape[:-1])
        else:
            y = linear(x, self.weight, out_dtype=x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, recipe={self.weight.recipe.name!r}"


class QuantizedHidden(torch.Tensor):
    """A normalized hidden state ``[..., H]`` that exists only quantized: ``activation``, its rows
    ``[M, H]`` in one :class:`fp8quant.QuantizedActivation` format. The :class:`FP8QuantLinear`
    modules it feeds read that; its shape, dtype and device are a tensor's, and any other use of
    it raises (never a read of bytes that were not written)."""

    activation: QuantizedActivation

    @staticmethod
    def __new__(cls, activation: QuantizedActivation, shape: torch.Size, dtype: torch.dtype) -> QuantizedHidden:
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=activation.q.device)
        t.activation = activation
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(
            f"{func}: a normalized hidden state that fp8quant's enable(fuse_norms=True) quantized in the norm was read "
            "by something other than the FP8 linears it found reading it; call enable(model, fuse_norms=False)"
        )


class PendingSum(torch.Tensor):
    """A fused decoder layer's output, ``residual + delta``, not yet added: the next fused layer's
    input norm (or the fused final norm) adds it in its own kernel, writing the sum into
    ``residual``'s rows (a buffer the layer owns) and keeping it as ``value``. Any other use
    (another module, an output_hidden_states reader) adds it first, as PyTorch does, once; its
    shape, dtype and device are the sum's."""

    residual: torch.Tensor
    delta: torch.Tensor
    value: torch.Tensor | None

    @staticmethod
    def __new__(cls, residual: torch.Tensor, delta: torch.Tensor) -> PendingSum:
        t = torch.Tensor._make_wrapper_subclass(cls, residual.shape, dtype=residual.dtype, device=residual.device)
        t.residual, t.delta, t.value = residual, delta, None
        return t

    def materialize(self) -> torch.Tensor:
        """The sum, added now if no fused norm has added it yet."""
        if self.value is None:
            self.value = self.residual + self.delta
        return self.value

    def take(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What a fused norm reads: ``(delta, residual)`` to add in its kernel (then ``value`` is
        ``residual``), or ``(value, None)`` when the sum exists already."""
        if self.value is not None:
            return self.value, None
        self.value = self.residual
        return self.delta, self.residual

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(a):
            return a.materialize() if isinstance(a, PendingSum) else a

        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


def _row_view(t: torch.Tensor) -> torch.Tensor:
    """``t [..., H]`` as rows ``[M, H]``: a view (the fused norms update a residual through it)."""
    return t.view(-1, t.shape[-1])


class FP8QuantRMSNorm(nn.Module):
    """A model's RMSNorm whose every reader is an :class:`FP8QuantLinear` of one activation
    format: :func:`fp8quant.rms_norm_quant` normalizes and quantizes in one pass and writes no
    bf16 rows; the output is a :class:`QuantizedHidden`. Called with a ``residual`` (the fused
    decoder layers), it first adds x into it, in place, and returns ``(output, residual)``."""

    def __init__(self, norm: nn.Module, fmt):
        super().__init__()
        self.weight = norm.weight
        self.eps = float(norm.variance_epsilon)
        self.format = fmt

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        f = self.format
        fmt = dict(group_size=f.group_size, scale_layout=f.scale_layout, ue8m0=f.ue8m0)
        if residual is None:
            q, s = rms_norm_quant(x.reshape(-1, x.shape[-1]), self.weight, self.eps, **fmt)
            return QuantizedHidden(QuantizedActivation(q, s, f), x.shape, x.dtype)
        q, s, _ = rms_norm_quant(x.reshape(-1, x.shape[-1]), self.weight, self.eps, residual=_row_view(residual), **fmt)
        return QuantizedHidden(QuantizedActivation(q, s, f), x.shape, x.dtype), residual


class FusedAddRMSNorm(nn.Module):
    """A model's RMSNorm whose output stays in x's dtype (it feeds a router, bf16 experts, or the
    output head), run by :func:`fp8quant.rms_norm`; called with a ``residual`` (the fused decoder
    layers), it first adds x into it, in place, in the same kernel, and returns ``(output,
    residual)``; given a :class:`PendingSum` alone (the final norm), it adds that the same way."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight
        self.eps = float(norm.variance_epsilon)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if isinstance(x, PendingSum) and residual is None:  # the model's final norm: the last layer's add too
            x, pending = x.take()
            if pending is not None:
                return self.forward(x, pending)[0]
        rows = x.reshape(-1, x.shape[-1])
        if residual is None:
            return rms_norm(rows, self.weight, self.eps).view(x.shape)
        y, _ = rms_norm(rows, self.weight, self.eps, residual=_row_view(residual))
        return y.view(x.shape), residual


# Per model type, each decoder layer's RMSNorms whose output only linears read, and those
# linears (a dense MLP's gate and up; an MoE layer's post-attention norm also feeds its router and
# experts in bf16, and DeepSeek-V3's kv_a_layernorm output goes to the KV cache)
FUSED_NORMS = {
    "deepseek_v3": {
        "input_layernorm": ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
        "self_attn.q_a_layernorm": ("self_attn.q_b_proj",),
        "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
    },
    "qwen3_moe": {
        "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
    },
}


def fuse_rms_norms(model: nn.Module) -> list[str]:
    """Replace each RMSNorm of ``FUSED_NORMS`` (in the decoder layers, ``*.layers.<i>``) whose
    readers are all :class:`FP8QuantLinear` of one activation format by an
    :class:`FP8QuantRMSNorm`; returns the names replaced."""
    table = FUSED_NORMS.get(getattr(model.config, "model_type", None), {})
    fused = []
    for name, layer in list(model.named_modules()):
        parent, _, index = name.rpartition(".")
        if not (parent.endswith("layers") and index.isdigit()):
            continue
        for norm_name, readers in table.items():
            norm = _submodule(layer, norm_name)
            linears = [_submodule(layer, r) for r in readers]
            if (
                norm is None
                or not hasattr(norm, "variance_epsilon")
                or not all(isinstance(m, FP8QuantLinear) for m in linears)
            ):
                continue
            formats = {m.weight.recipe.activation for m in linears}
            if len(formats) == 1 and norm.weight.dtype in (torch.bfloat16, torch.float16):
                layer.set_submodule(norm_name, FP8QuantRMSNorm(norm, formats.pop()))
                fused.append(f"{name}.{norm_name}")
    return fused


# The decoder layers whose forward fuse_residual_adds replaces (transformers 5.17's: residual,
# input norm, attention, residual add, post-attention norm, MLP, residual add)
FUSED_LAYERS = {"deepseek_v3": "DeepseekV3DecoderLayer", "qwen3_moe": "Qwen3MoeDecoderLayer"}


def fused_decoder_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values=None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs,
) -> PendingSum:
    """A ``FUSED_LAYERS`` decoder layer's forward with both residual adds done by norm kernels:
    the previous fused layer's output arrives as a :class:`PendingSum`, which the input norm adds
    (into a buffer that layer owns); the add after attention is written into the attention
    output's rows by the post-attention norm; and this layer's own output is returned as a
    PendingSum for the next. The layer's input tensor is never written."""
    residual = hidden_states
    if isinstance(hidden_states, PendingSum):
        x, pending = hidden_states.take()
        if pending is not None:
            hidden_states, residual = self.input_layernorm(x, residual=pending)
        else:
            residual, hidden_states = x, self.input_layernorm(x)
    else:
        hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    # Add and normalize: the fp32 sum rounded to the dtype is the same either way round
    hidden_states, residual = self.post_attention_layernorm(residual, residual=hidden_states.contiguous())
    return PendingSum(residual, self.mlp(hidden_states))


def _add_norm(norm: nn.Module) -> nn.Module | None:
    """``norm`` if it can take a residual (an FP8QuantRMSNorm), else a FusedAddRMSNorm of it, or
    None when the fused kernels cannot run it."""
    if isinstance(norm, (FP8QuantRMSNorm, FusedAddRMSNorm)):
        return norm
    if not (hasattr(norm, "variance_epsilon") and norm.weight.dtype in (torch.bfloat16, torch.float16)
            and norm.weight.shape[0] % 16 == 0 and norm.weight.shape[0] <= 16384):  # fmt: skip
        return None
    return FusedAddRMSNorm(norm)


def fuse_residual_adds(model: nn.Module) -> list[str]:
    """Fold every residual add of the decoder layers of ``FUSED_LAYERS`` (``*.layers.<i>``) into
    the norm kernel that reads the sum: the add after attention into the post-attention norm,
    and the add at a layer's end into the next layer's input norm (the layer returns a
    :class:`PendingSum`) or, after the last layer, into the model's final norm. Norms that are
    not :class:`FP8QuantRMSNorm` become :class:`FusedAddRMSNorm`; a layer whose two norms the
    kernels cannot run is left as it is (it adds any PendingSum it gets first). Returns the
    names of the layers changed."""
    layer_class = FUSED_LAYERS.get(getattr(model.config, "model_type", None))
    fused = []
    for name, layer in list(model.named_modules()):
        if type(layer).__name__ != layer_class:
            continue
        norms = _add_norm(layer.input_layernorm), _add_norm(layer.post_attention_layernorm)
        if None in norms:
            continue
        layer.input_layernorm, layer.post_attention_layernorm = norms
        layer.forward = MethodType(fused_decoder_forward, layer)
        fused.append(name)
    if fused:
        for module in model.modules():  # the decoder's final norm (the module holding the layers)
            final = _add_norm(module.norm) if hasattr(module, "layers") and hasattr(module, "norm") else None
            if final is not None:
                module.norm = final
    return fused


def _submodule(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _experts_weights(module: nn.Module) -> tuple[ExpertWeights, ExpertWeights]:
    """The experts' weights for :func:`fp8quant.moe_layer`, prepared on the first call."""
    cached = getattr(module, "_fp8quant_weights", None)
    if cached is None:
        where = type(module).__name__
        if not getattr(module, "has_gate", True) or getattr(module, "has_bias", False):
            raise NotImplementedError(f"{where}: fp8quant runs gated experts without bias (SiLU(gate) * up)")
        if getattr(module, "swiglu_alpha", None) is not None or getattr(module, "limit", None) is not None:
            raise NotImplementedError(f"{where}: fp8quant's SiLU-and-mul has no clamped SwiGLU")
        if not isinstance(module.act_fn, nn.SiLU) and type(module.act_fn).__name__ != "SiLUActivation":
            raise NotImplementedError(
                f"{where}: fp8quant's experts apply SiLU, this one {type(module.act_fn).__name__}"
            )
        _check_block(module.block_size, where)
        _check_dynamic(module.activation_scheme, where)
        _check_scale(module.gate_up_proj_scale_inv, where)
        cached = (prepare_experts(module.gate_up_proj.detach(), module.gate_up_proj_scale_inv.detach()),
                  prepare_experts(module.down_proj.detach(), module.down_proj_scale_inv.detach()))  # fmt: skip
        module._fp8quant_weights = cached
    return cached


def experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The ``"fp8quant"`` experts implementation of ``FP8Experts``: :func:`fp8quant.moe_layer`
    (routing, dispatch + quantize, grouped GEMM, SiLU-and-mul + quantize, grouped GEMM, combine)
    on ``hidden_states [T, H]`` and the router's ``top_k_index`` / ``top_k_weights [T, k]``."""
    w13, w2 = _experts_weights(self)
    x = hidden_states.to(torch.bfloat16)
    out = moe_layer(
        x, top_k_index, top_k_weights.float(), w13, w2, backend=getattr(self, "_fp8quant_moe_backend", "auto")
    )
    return out.to(hidden_states.dtype)


def _rows(a: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, output_dtype: torch.dtype) -> torch.Tensor:
    """``a [M, K]`` against the fp8 ``weight [N, K]`` and its block scales, by :func:`fp8quant.linear`
    (the weight prepared on each call)."""
    return linear(a, (weight, scale), out_dtype=output_dtype)


def seam_matmul(input, weight, weight_scale_inv, block_size, output_dtype=None, activation_scale=None):
    """``FineGrainedFP8.matmul``: ``input [..., K]`` against the fp8 ``weight [N, K]``."""
    _check_block(block_size, "FineGrainedFP8.matmul")
    if activation_scale is not None:
        _check_dynamic("static", "FineGrainedFP8.matmul")
    _check_scale(weight_scale_inv, "FineGrainedFP8.matmul")
    return _rows(input, weight, weight_scale_inv, output_dtype or input.dtype)


def seam_batched_matmul(input, weight, weight_scale_inv, block_size=None, expert_ids=None):
    """``FineGrainedFP8.batched_matmul``: row s of ``input [S, K]`` against expert
    ``expert_ids[s]`` of ``weight [E, N, K]``; rows of other ids (expert parallelism's
    sentinels) are left 0."""
    _check_block(block_size, "FineGrainedFP8.batched_matmul")
    out = input.new_zeros(input.shape[0], weight.shape[1])
    for e in torch.unique(expert_ids).tolist():
        if 0 <= e < weight.shape[0]:
            rows = (expert_ids == e).nonzero(as_tuple=True)[0]
            out[rows] = _rows(input[rows], weight[e], weight_scale_inv[e], input.dtype)
    return out


def seam_grouped_matmul(input, weight, weight_scale_inv, offsets=None, tokens_per_expert=None, block_size=None):
    """``FineGrainedFP8.grouped_matmul``: ``input [S, K]`` sorted by expert, expert e's rows ending
    at ``offsets[e]`` (an inclusive cumulative sum); rows past ``offsets[-1]`` are left 0."""
    _check_block(block_size, "FineGrainedFP8.grouped_matmul")
    out = input.new_zeros(input.shape[0], weight.shape[1])
    begin = 0
    for e, end in enumerate(offsets.tolist()):
        if end > begin:
            out[begin:end] = _rows(input[begin:end], weight[e], weight_scale_inv[e], input.dtype)
        begin = end
    return out


def enable(model: nn.Module, *, backend: str = "auto", moe_backend: str = "auto", fuse_norms: bool = True) -> nn.Module:
    """Run a FineGrainedFP8 model's FP8 matmuls on fp8quant, offline, in place: every
    ``FP8Linear`` is replaced by an :class:`FP8QuantLinear` (weights prepared once for
    ``backend``, :func:`fp8quant.select_backend`'s choice by default), the experts run the
    ``"fp8quant"`` experts implementation (:func:`experts_forward`: :func:`fp8quant.moe_layer`
    with ``moe_backend``, ``"auto"``, ``"deep_gemm"``, ``"triton"`` or ``"reference"``), and transformers' kernel seam
    (``FineGrainedFP8``, process-wide: every FineGrainedFP8 model of the process) is set to
    fp8quant's matmuls for any other FP8 path. With ``fuse_norms``, the RMSNorms whose readers
    are all FP8 linears of one format (``FUSED_NORMS``: DeepSeek-V3's and Qwen3-MoE's attention
    input norms, DeepSeek-V3's q_a norm, the dense layers' post-attention norms)
    normalize and quantize in one kernel, once for all their readers, and every residual add of
    the decoder layers is done in the norm kernel that reads the sum (:func:`fuse_residual_adds`). Call it after the model is on its device. Returns the model."""
    if moe_backend not in MOE_BACKENDS:
        raise ValueError(f"moe_backend must be one of {MOE_BACKENDS} (fp8quant.moe_layer's), got {moe_backend!r}")
    fg = finegrained_fp8()
    fg._FINEGRAINED_FP8 = fg.FineGrainedFP8(matmul=seam_matmul, batched_matmul=seam_batched_matmul,
                                            grouped_matmul=seam_grouped_matmul)  # fmt: skip
    fg.FP8ExpertsInterface.register(EXPERTS_IMPLEMENTATION, experts_forward)
    experts = False
    for name, module in list(model.named_modules()):
        if isinstance(module, fg.FP8Linear) and module.weight.element_size() == 1:
            model.set_submodule(name, FP8QuantLinear.from_fp8_linear(module, backend, name))
        elif isinstance(module, fg.FP8Experts):
            _experts_weights(module)  # checked and prepared now, not in the first forward
            module._fp8quant_moe_backend = moe_backend
            experts = True
    if experts:
        model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
    if fuse_norms:
        fuse_rms_norms(model)
        fuse_residual_adds(model)
    return model
