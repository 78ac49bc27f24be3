"""fp8quant.integrations.transformers on the GPU at real per-layer dims (DeepSeek-V3's and
Qwen3-30B-A3B's, two decoder layers: one dense, one MoE, random weights): the enabled model's
logits within 1.1x of the format floor's distance to bf16, with every GEMM backend pair the
machine has (DeepGEMM where it imports, torch._scaled_mm and fp8quant's Triton grouped GEMM
otherwise), and generate() running offline. Marked ``gpu``."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from fp8quant.bench.model import build, model_config  # noqa: E402
from fp8quant.gemm import _have_deep_gemm, calc_diff  # noqa: E402
from fp8quant.integrations import transformers as fqt  # noqa: E402

pytestmark = pytest.mark.gpu

BACKENDS = [
    pytest.param("auto", "auto", id="auto"),  # DeepGEMM for both where it imports
    pytest.param("scaled_mm", "triton", id="scaled_mm-triton"),  # without DeepGEMM
]


@pytest.mark.parametrize(("backend", "moe_backend"), BACKENDS)
@pytest.mark.parametrize("arch", ["deepseek-v3", "qwen3-moe"])
@torch.no_grad()
def test_real_dims_within_the_floor(arch, backend, moe_backend):
    if backend == "scaled_mm" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("torch._scaled_mm's blockwise recipe is SM90's")
    device = torch.device("cuda")
    bf16, floor, fp8 = build(arch, 2, device, tiny=False, backend=backend, moe_backend=moe_backend)
    recipes = sorted({m.weight.recipe.name for m in fp8.modules() if isinstance(m, fqt.FP8QuantLinear)})
    ids = torch.randint(0, model_config(arch, 2, False).vocab_size, (1, 256), device=device,
                        generator=torch.Generator(device=device).manual_seed(0))  # fmt: skip
    ref = bf16(input_ids=ids, use_cache=False).logits.float()
    got = fp8(input_ids=ids, use_cache=False).logits.float()
    low = floor(input_ids=ids, use_cache=False).logits.float()
    assert torch.isfinite(got).all()
    ours, bound = calc_diff(got, ref), calc_diff(low, ref)
    print(
        f"{arch} {backend}/{moe_backend} ({recipes}, DeepGEMM imports: {_have_deep_gemm()}): calc_diff against "
        f"bf16 {ours:.3e}, the floor {bound:.3e}"
    )
    assert ours <= 1.1 * bound
    out = fp8.generate(ids[:, :16], max_new_tokens=8, do_sample=False)
    assert out.shape == (1, 24)
