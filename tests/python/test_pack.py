"""The public scale transforms and requantize_ue8m0 on the CPU (their reference path) and their
argument checks; the kernels are tested against the same references in test_pack_gpu.py."""

from __future__ import annotations

import pytest
import torch
from handmath import full_buffer

import fp8quant
from fp8quant import _ext, reference


def in_layout(values: torch.Tensor, layout: str) -> torch.Tensor:
    spec = fp8quant.scale_spec(layout, values.shape[-2], values.shape[-1], tuple(values.shape[:-2]))
    return torch.zeros(spec.numel).as_strided(spec.shape, spec.stride).copy_(values)


def test_cpu_calls_are_the_reference():
    values = 2.0 ** torch.arange(-20, 10, dtype=torch.float32).view(2, 5, 3)
    for src in ("row", "mn", "mn_tma"):
        scale = in_layout(values, src)
        for dst in ("row", "mn", "mn_tma"):
            got = fp8quant.convert_scales(scale, src, dst)
            assert got.stride() == reference.convert_scales(scale, src, dst).stride() and torch.equal(got, values)
        packed = fp8quant.pack_ue8m0(scale, src)
        assert torch.equal(full_buffer(packed), full_buffer(reference.pack_ue8m0(scale, src)))
        assert torch.equal(fp8quant.unpack_ue8m0(packed, 3, src), scale)
    w_scale = 2.0 ** torch.arange(6, dtype=torch.float32).view(2, 3)
    assert torch.equal(fp8quant.sm100_weight_scales(w_scale, 200), reference.sm100_weight_scales(w_scale, 200))


def test_hand_values():
    """Bytes written out by hand: 1.0 -> 0x7F, 2^-127 -> 0x00, 2^127 -> 0xFE; G = 3 leaves byte 3 zero."""
    scale = torch.tensor([[1.0, 2.0**-127, 2.0**127]])
    packed = fp8quant.pack_ue8m0(scale, "row")
    assert packed.shape == (1, 1) and packed.stride() == (1, 4)
    assert full_buffer(packed).tolist() == [0x00FE007F, 0, 0, 0]


def test_invalid_values_raise_on_the_cpu():
    scale = torch.ones(4, 6)
    scale[2, 3] = 3.0
    with pytest.raises(ValueError, match=r"^scale\[2, 3\] = 3.0 is not a power of two in \[2\^-127, 2\^127\]"):
        fp8quant.pack_ue8m0(scale, "row")
    w_scale = torch.ones(2, 2)
    w_scale[1, 0] = 0.3
    for fn in (fp8quant.sm100_weight_scales, reference.sm100_weight_scales):  # named as the argument
        with pytest.raises(ValueError, match=r"^w_scale\[1, 0\] = 0.3000"):
            fn(w_scale, 256)
    packed = fp8quant.pack_ue8m0(torch.ones(2, 5), "row")
    packed[1, 1] = 0xFF
    with pytest.raises(ValueError, match=r"^packed holds the UE8M0 NaN byte 0xFF for group \[1, 4\]$"):
        fp8quant.unpack_ue8m0(packed, 5, "row")


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: fp8quant.convert_scales(torch.ones(3, 2), "row", "packed_ue8m0"), ValueError, r"^to_layout must be one of"),
        (lambda: fp8quant.convert_scales(torch.ones(3, 2), "rows", "mn"), ValueError, r"^from_layout must be one of \(.*\), got 'rows'$"),
        (lambda: fp8quant.convert_scales(torch.ones(3, 2), "row", "col"), ValueError, r"^to_layout must be one of \(.*\), got 'col'$"),
        (lambda: fp8quant.pack_ue8m0(torch.ones(3, 2), "rows"), ValueError, r"^from_layout must be one of \(.*\), got 'rows'$"),
        (lambda: fp8quant.pack_ue8m0(torch.ones(3, 2), None), ValueError, r"^from_layout must be one of .*, got None$"),
        (lambda: fp8quant.unpack_ue8m0(torch.ones(3, 1, dtype=torch.int32), 3, "rows"), ValueError, r"^to_layout must be one of \(.*\), got 'rows'$"),
        (lambda: fp8quant.unpack_ue8m0(torch.ones(4, 1), 3), TypeError, r"^packed must be torch.int32 for layout 'packed_ue8m0'"),
        (lambda: fp8quant.unpack_ue8m0(torch.ones(3, 2, dtype=torch.int32), 5), ValueError, r"^packed must have shape \(3, 2\) and strides \(1, 4\)"),
        (lambda: fp8quant.unpack_ue8m0([[1]], 3), TypeError, r"^packed must be a torch.Tensor, got list$"),
        (lambda: fp8quant.convert_scales(torch.ones(3, 2), "mn", "row"), ValueError, r"^scale must have shape \(3, 2\) and strides \(1, 3\)"),
        (lambda: fp8quant.pack_ue8m0(torch.ones(3, 2, dtype=torch.float64), "row"), TypeError, r"^scale must be torch.float32"),
        (lambda: fp8quant.pack_ue8m0(torch.ones(3), "row"), ValueError, r"^scale must be \[\*, M, G\]"),
        (lambda: fp8quant.unpack_ue8m0(torch.ones(3, 2, dtype=torch.int32), 3), ValueError, r"^packed has 2 words a row; 3 groups need 1$"),
        (lambda: fp8quant.unpack_ue8m0(torch.ones(3, 1, dtype=torch.int32), 0), ValueError, r"^num_groups must be an int >= 1"),
        (lambda: fp8quant.sm100_weight_scales(torch.ones(2, 3), 300), ValueError, r"^n must be an int with ceil\(n / block_n\) == 2"),
        (lambda: fp8quant.sm100_weight_scales(torch.ones(3, 2).t(), 300), ValueError, r"^w_scale must be contiguous"),
        (lambda: fp8quant.requantize_ue8m0(torch.ones(4, 4), torch.ones(1, 1)), TypeError, r"^w must be a float8_e4m3fn"),
        (lambda: fp8quant.requantize_ue8m0(torch.ones(300, 4).to(torch.float8_e4m3fn), torch.ones(2, 1)), ValueError,
         r"^w_scale must be float32 of shape \(3, 1\) for w \(300, 4\) and blocks \(128, 128\), got torch.float32 \(2, 1\)$"),
        (lambda: fp8quant.requantize_ue8m0(torch.ones(4, 4).to(torch.float8_e4m3fn), torch.ones(1, 1), eps=0.0), ValueError, r"^eps must be"),
    ],
)  # fmt: skip
def test_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_requantize_cpu_is_the_reference():
    g = torch.Generator().manual_seed(3)
    w, s = fp8quant.per_block_quant(torch.randn(2, 200, 300, generator=g))
    q2, s2 = fp8quant.requantize_ue8m0(w, s)
    rq, rs = reference.requantize_ue8m0(w, s)
    assert torch.equal(q2.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s2, rs)
    assert bool((s2 == torch.exp2(torch.log2(s2).round())).all())


def test_launch_rows_without_dtype_code(monkeypatch):
    """requantize_ue8m0's entry takes no dtype: the launch passes x, then the geometry."""
    monkeypatch.setattr(_ext, "current_device", lambda: -1)
    monkeypatch.setattr(_ext, "raw_stream", lambda device: 0xBEEF)
    calls = []
    x = torch.empty(3, 5, 16, dtype=torch.float8_e4m3fn)
    q = torch.empty(3, 5, 16, dtype=torch.float8_e4m3fn)
    _ext.launch_rows(lambda *args: calls.append(args), x, q, "rest", dtype_code=False)
    assert calls == [(x.data_ptr(), 3, 5, 16, 80, 16, q.data_ptr(), 80, 16, "rest", 0xBEEF)]
