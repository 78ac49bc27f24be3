"""Scale layout geometry (SPEC.md section 2): fp8quant.scale_spec / empty_scale against the
table written out by hand, and against the C API's own layout math (fp8quant._C.scale_shape)."""

from __future__ import annotations

import pytest
import torch

import fp8quant
from fp8quant import empty_scale, scale_spec
from fp8quant._ext import _C

LAYOUT_CODES = {"row": 0, "mn": 1, "mn_tma": 2, "packed_ue8m0": 3}
MS = (0, 1, 3, 4, 5, 127, 129)
GS = (1, 2, 3, 4, 5, 8, 9)
BATCHES = ((), (1,), (3,), (0,))

needs_ext = pytest.mark.skipif(_C is None, reason="fp8quant._C is not built")


def expected_geometry(layout: str, m: int, g: int):
    """(dtype, rows, cols, (row stride, col stride)) from the SPEC table."""
    ma = (m + 3) // 4 * 4
    p = (g + 3) // 4
    return {
        "row": (torch.float32, m, g, (g, 1)),
        "mn": (torch.float32, m, g, (1, m)),
        "mn_tma": (torch.float32, ma, g, (1, ma)),
        "packed_ue8m0": (torch.int32, ma, p, (1, ma)),
    }[layout]


def test_layout_names():
    assert fp8quant.SCALE_LAYOUTS == ("row", "mn", "mn_tma", "packed_ue8m0")


def shapes():
    return [(m, g) for m in MS for g in GS]


@pytest.mark.parametrize("layout", fp8quant.SCALE_LAYOUTS)
@pytest.mark.parametrize("batch", BATCHES)
def test_scale_spec(layout, batch):
    for m, g in shapes():
        dtype, rows, cols, inner = expected_geometry(layout, m, g)
        spec = scale_spec(layout, m, g, batch)
        block = rows * cols
        where = f"m={m} g={g}"
        assert spec.layout == layout
        assert spec.dtype == dtype
        assert (spec.rows, spec.cols) == (rows, cols), where
        assert spec.shape == (*batch, m, cols), where
        assert spec.stride == ((block,) if batch else ()) + inner, where
        assert spec.numel == block * (batch[0] if batch else 1), where


def test_scale_spec_worked_examples():
    # M = 5, G = 3: Ma = 8, P = 1
    assert scale_spec("row", 5, 3).stride == (3, 1)
    assert scale_spec("mn", 5, 3).stride == (1, 5)
    assert scale_spec("mn_tma", 5, 3).stride == (1, 8)
    assert scale_spec("mn_tma", 5, 3).numel == 24
    assert scale_spec("packed_ue8m0", 5, 3).shape == (5, 1)
    assert scale_spec("packed_ue8m0", 5, 3).numel == 8
    # batched mn_tma: strides (Ma*G, 1, Ma)
    assert scale_spec("mn_tma", 5, 3, (2,)).stride == (24, 1, 8)
    assert scale_spec("mn_tma", 5, 3, (2,)).numel == 48
    assert scale_spec("packed_ue8m0", 129, 9, (2,)).stride == (132 * 3, 1, 132)


def test_scale_spec_rejects_unknown_layout():
    with pytest.raises(ValueError, match="scale_layout"):
        scale_spec("col_major", 4, 2)
    with pytest.raises(ValueError, match="scale_layout"):
        empty_scale("ROW", 4, 2)


@pytest.mark.parametrize(
    "args, error, match",
    [
        (("row", -1, 4), ValueError, r"^m must be an int >= 0, got -1$"),
        (("mn_tma", -5, 4), ValueError, r"^m must be an int >= 0, got -5$"),
        (("mn_tma", 4.5, 4), ValueError, r"^m must be an int >= 0, got 4.5$"),
        (("mn", True, 4), ValueError, r"^m must be an int >= 0, got True$"),
        (("packed_ue8m0", 4, -2), ValueError, r"^num_groups must be an int >= 0, got -2$"),
        (("row", 4, 2.0), ValueError, r"^num_groups must be an int >= 0, got 2.0$"),
        (("mn_tma", 4, 2, (2, -1)), ValueError, r"^batch\[1\] must be an int >= 0, got -1$"),
        (("mn_tma", 4, 2, 3), TypeError, r"^batch must be a tuple of ints \(the leading dimensions\), got int$"),
    ],
)
def test_sizes_must_be_ints_at_least_zero(args, error, match):
    """m, num_groups and the batch sizes are ints >= 0 (as fp8quant_scale_shape has them): a
    negative m made a negative numel (empty_scale: torch's RuntimeError), a float one float strides."""
    for fn in (scale_spec, empty_scale):
        with pytest.raises(error, match=match):
            fn(*args)
    assert scale_spec("mn_tma", 0, 0, (0,)).numel == 0  # zero sizes are fine


@pytest.mark.parametrize("layout", fp8quant.SCALE_LAYOUTS)
@pytest.mark.parametrize("batch", ((), (3,)))
def test_empty_scale(layout, batch):
    for m, g in shapes():
        spec = scale_spec(layout, m, g, batch)
        s = empty_scale(layout, m, g, batch)
        where = f"m={m} g={g}"
        assert s.dtype == spec.dtype
        assert s.device.type == "cpu"
        assert tuple(s.shape) == spec.shape, where
        assert s.stride() == spec.stride, where
        assert s.storage_offset() == 0
        # The storage covers the padding rows of the last column too.
        assert s.untyped_storage().nbytes() == spec.numel * 4, where


def test_empty_scale_under_allocation_is_avoided():
    """torch.empty_strided alone would hold (G-1)*Ma + M elements, not G*Ma."""
    naive = torch.empty_strided((5, 3), (1, 8), dtype=torch.float32)
    assert naive.untyped_storage().nbytes() == (2 * 8 + 5) * 4
    s = empty_scale("mn_tma", 5, 3)
    assert s.untyped_storage().nbytes() == 3 * 8 * 4


def test_empty_scale_device():
    s = empty_scale("packed_ue8m0", 5, 9, (2,), device="meta")
    assert s.device.type == "meta"
    assert s.shape == (2, 5, 3) and s.stride() == (24, 1, 8)


# --- the C API's layout math -------------------------------------------------------------------


@needs_ext
def test_extension_layout_codes():
    assert (_C.SCALE_ROW, _C.SCALE_MN, _C.SCALE_MN_TMA, _C.SCALE_PACKED_UE8M0) == (0, 1, 2, 3)


@needs_ext
@pytest.mark.parametrize("layout", fp8quant.SCALE_LAYOUTS)
@pytest.mark.parametrize("batch", ((), (3,), (0,)))
def test_c_scale_shape_matches_python(layout, batch):
    for m, g in shapes():
        spec = scale_spec(layout, m, g, batch)
        rows, cols, row_stride, col_stride, batch_stride, numel = _C.scale_shape(
            LAYOUT_CODES[layout], batch[0] if batch else 1, m, g
        )
        where = f"m={m} g={g}"
        assert (rows, cols) == (spec.rows, spec.cols), where
        assert (row_stride, col_stride) == spec.stride[-2:], where
        assert batch_stride == spec.rows * spec.cols, where
        if batch:
            assert spec.stride[0] == batch_stride, where
        assert numel == spec.numel, where


@needs_ext
def test_c_scale_shape_worked_example():
    assert _C.scale_shape(2, 2, 5, 3) == (8, 3, 1, 8, 24, 48)
    assert _C.scale_shape(3, 1, 5, 9) == (8, 3, 1, 8, 24, 24)
    assert _C.scale_shape(0, 1, 5, 3) == (5, 3, 3, 1, 15, 15)
    assert _C.scale_shape(1, 1, 5, 3) == (5, 3, 1, 5, 15, 15)


@needs_ext
def test_c_scale_shape_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"^m: must be >= 0, got -1$"):
        _C.scale_shape(0, 1, -1, 3)
    with pytest.raises(ValueError, match=r"^num_groups: must be >= 0, got -2$"):
        _C.scale_shape(2, 1, 4, -2)
    with pytest.raises(ValueError, match=r"^batch: must be >= 0, got -1$"):
        _C.scale_shape(1, -1, 4, 2)
    with pytest.raises(ValueError, match=r"^scale_layout: unknown scale layout 7$"):
        _C.scale_shape(7, 1, 4, 2)
    with pytest.raises(ValueError, match=r"^m: .*overflow"):
        _C.scale_shape(2, 1, 2**40, 2**30)
