"""The op pattern (fp8quant._ops.Op) on a toy op, on the CPU: one declaration gives an eager call
that skips the dispatcher, registered functional and out= ops with fake implementations,
out= checks, and torch.compile support, padded outputs included."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fp8quant
from fp8quant._ops import Buffer, Op, TensorMeta, tracing

POISON = -7.0


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


def _geometry(x: TensorMeta, factor: float) -> tuple[Buffer, Buffer]:
    """y like x; s [M, 2] column-major with rows padded to 4 (a buffer of 2 * align(M, 4))."""
    m = x.shape[-2]
    rows = _align4(m)
    return Buffer(x.dtype, x.shape), Buffer(torch.float32, (m, 2), (1, rows), 2 * rows, "for the toy layout")


def _reference(x: torch.Tensor, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y = factor * x; s[:, 0] = row sums, s[:, 1] = row maxima; padding rows 0."""
    m = x.shape[-2]
    rows = _align4(m)
    s = torch.zeros(2 * rows, dtype=torch.float32, device=x.device).as_strided((m, 2), (1, rows))
    s[:, 0] = x.sum(-1)
    s[:, 1] = x.amax(-1)
    return x * factor, s


def _launch(*args):
    raise AssertionError("the CPU path never launches")


TOY = Op("toy", ("y", "s"), _geometry, _launch, _reference, namespace="fp8quant_test")


def x_of(m: int = 5, k: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn((m, k), generator=torch.Generator().manual_seed(seed))


def whole(s: torch.Tensor, m: int) -> torch.Tensor:
    return s.as_strided((2 * _align4(m),), (1,))


def check(y, s, x, factor=3.0):
    ref_y, ref_s = _reference(x, factor)
    assert torch.equal(y, ref_y)
    assert s.stride() == (1, _align4(x.shape[0])) and torch.equal(s, ref_s)
    assert torch.equal(whole(s, x.shape[0]), whole(ref_s, x.shape[0]))  # padding written


def test_eager_call_allocates_the_declared_geometry():
    x = x_of()
    y, s = TOY(x, 3.0)
    check(y, s, x)
    assert s.untyped_storage().nbytes() == 2 * 8 * 4  # the padding rows are allocated


def test_eager_call_skips_the_registered_op(monkeypatch):
    """Eager calls on plain tensors run without the dispatcher; traced calls go through it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the eager path went through the registered op")

    monkeypatch.setattr(TOY, "functional", refuse)
    monkeypatch.setattr(TOY, "out_variant", refuse)
    x = x_of()
    check(*TOY(x, 3.0), x)
    y, s = torch.empty_like(x), torch.full((16,), POISON).as_strided((5, 2), (1, 8))
    TOY(x, 3.0, out=(y, s))
    check(y, s, x)
    with FakeTensorMode(), pytest.raises(AssertionError, match="went through the registered op"):
        TOY(torch.empty(5, 8), 3.0)


def test_tracing():
    x = x_of()
    assert not tracing()
    with FakeTensorMode():
        assert tracing()
    seen = []
    torch.compile(lambda t: seen.append(tracing()) or t, backend="eager", fullgraph=False)(x)
    assert seen == [True]


def test_tensor_subclasses_take_the_registered_op(monkeypatch):
    """A fake (or other subclass) tensor outside any mode is not run eagerly either."""
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x_of())

    def registered(*args, **kwargs):
        raise AssertionError("the registered op")

    monkeypatch.setattr(TOY, "functional", registered)
    with pytest.raises(AssertionError, match="the registered op"):
        TOY(fake, 3.0)


class _PlainSubclass(torch.Tensor):
    """A subclass that overrides neither __torch_function__ nor __torch_dispatch__."""


@pytest.mark.parametrize(
    "wrap",
    [lambda t: torch.nn.Parameter(t, requires_grad=False), lambda t: t.as_subclass(_PlainSubclass)],
    ids=["Parameter", "plain subclass"],
)
def test_parameters_take_the_eager_path(monkeypatch, wrap):
    """nn.Parameter (every model's norm weight) and subclasses that override neither
    __torch_function__ nor __torch_dispatch__ are plain tensors to the op: eager, padded out=
    buffers taken (the traced path refuses those, as torch.compile would drop their padding)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the eager path went through the registered op")

    monkeypatch.setattr(TOY, "functional", refuse)
    monkeypatch.setattr(TOY, "out_variant", refuse)
    x = x_of()
    check(*TOY(wrap(x.clone()), 3.0), x)
    y, s = torch.empty_like(x), torch.full((16,), POISON).as_strided((5, 2), (1, 8))
    TOY(wrap(x.clone()), 3.0, out=(y, s))
    check(y, s, x)


def test_device_context_is_not_tracing(monkeypatch):
    """``with torch.device(...)`` is a torch-function mode that only sets the default device: calls
    under it stay eager (padded out= taken); any other function mode still counts as tracing."""

    class Passthrough(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def refuse(*args, **kwargs):
        raise AssertionError("the eager path went through the registered op")

    monkeypatch.setattr(TOY, "functional", refuse)
    monkeypatch.setattr(TOY, "out_variant", refuse)
    x = x_of()
    with torch.device("cuda"):  # no GPU needed to enter it; the GPU path's validations skip when tracing
        assert not tracing()
    with torch.device("cpu"):
        assert not tracing()
        check(*TOY(x, 3.0), x)
        y, s = torch.empty_like(x), torch.full((16,), POISON).as_strided((5, 2), (1, 8))
        TOY(x, 3.0, out=(y, s))
        check(y, s, x)
        with Passthrough():
            assert tracing()
    with Passthrough(), torch.device("cpu"):
        assert tracing()


def test_public_ops_take_parameters_and_device_contexts():
    """The reproductions: rms_norm_quant with an nn.Parameter weight and a padded mn_tma out=, and
    per_token_group_quant under ``with torch.device("cpu")`` with one, both refused before ("out=
    with a padded buffer ... cannot be compiled") though nothing was being compiled."""
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    w = torch.randn(256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    out = (torch.empty(6, 256, dtype=torch.float8_e4m3fn), fp8quant.empty_scale("mn_tma", 6, 2))
    q, s = fp8quant.rms_norm_quant(x, torch.nn.Parameter(w, requires_grad=False), scale_layout="mn_tma", out=out)
    want_q, want_s = fp8quant.reference.rms_norm_quant(x, w, scale_layout="mn_tma")
    assert q is out[0] and s is out[1]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)

    out = (torch.empty(6, 256, dtype=torch.float8_e4m3fn), fp8quant.empty_scale("mn_tma", 6, 2))
    with torch.device("cpu"):
        q, s = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma", out=out)
    want_q, want_s = fp8quant.reference.per_token_group_quant(x, 128, scale_layout="mn_tma")
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)


def test_out_writes_whole_buffers():
    x = x_of()
    y = torch.full_like(x, POISON)
    s = torch.full((16,), POISON).as_strided((5, 2), (1, 8))
    assert TOY(x, 3.0, out=(y, s)) == (y, s)
    check(y, s, x)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda x: (torch.empty_like(x), None), TypeError, r"^out\[1\] \(s\) must be a torch\.Tensor, got NoneType$"),
        (lambda x: (torch.empty_like(x),), TypeError, r"^out must be a \(y, s\) pair of tensors$"),
        (
            lambda x: (x.double(), torch.empty(16).as_strided((5, 2), (1, 8))),
            TypeError,
            r"^out\[0\] \(y\) must be torch\.float32, got torch\.float64$",
        ),
        (
            lambda x: (torch.empty(5, 9), torch.empty(16).as_strided((5, 2), (1, 8))),
            ValueError,
            r"^out\[0\] \(y\) must have shape \(5, 8\), got \(5, 9\)$",
        ),
        (
            lambda x: (torch.empty(8, 5).t(), torch.empty(16).as_strided((5, 2), (1, 8))),
            ValueError,
            r"^out\[0\] \(y\) must have a contiguous last dimension",
        ),
        (
            lambda x: (torch.empty_like(x), torch.empty(5, 2)),
            ValueError,
            r"^out\[1\] \(s\) must have strides \(1, 8\) for the toy layout, got \(2, 1\)$",
        ),
        (
            lambda x: (torch.empty_like(x), torch.empty_strided((5, 2), (1, 8))),
            ValueError,
            r"^out\[1\] \(s\) needs 64 bytes of storage from its start \(padding included\) for the toy layout",
        ),
        (
            lambda x: (torch.empty(1, 8).expand(5, 8), torch.empty(16).as_strided((5, 2), (1, 8))),
            ValueError,
            r"^out\[0\] \(y\) must not overlap itself, got strides \(0, 1\)$",
        ),
        (lambda x: (x, torch.empty(16).as_strided((5, 2), (1, 8))), ValueError, r"^out\[0\] \(y\) overlaps x"),
    ],
    ids=[
        "not-a-tensor",
        "too-few",
        "dtype",
        "shape",
        "last-dim",
        "strides",
        "storage",
        "self-overlap",
        "overlaps-input",
    ],
)
def test_out_checks_name_the_output(make, error, message):
    x = x_of()
    with pytest.raises(error, match=message):
        TOY(x, 3.0, out=make(x))


def test_outputs_overlapping_each_other():
    x = x_of()
    buf = torch.empty(64)
    y = buf[:40].view(5, 8)
    s = buf[32:].as_strided((5, 2), (1, 8))
    with pytest.raises(ValueError, match=r"^out\[1\] \(s\) overlaps out\[0\] \(y\)"):
        TOY(x, 3.0, out=(y, s))


def test_fake_impl_reports_the_padded_geometry():
    with FakeTensorMode():
        y, s = TOY.functional(torch.empty(5, 8), 3.0)
        assert y.shape == (5, 8) and s.stride() == (1, 8) and s.untyped_storage().nbytes() == 64


def test_opcheck():
    x = x_of()
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic", "test_schema")
    torch.library.opcheck(TOY.functional, (x, 3.0), test_utils=utils)
    y, s = torch.empty_like(x), torch.empty(16).as_strided((5, 2), (1, 8))
    torch.library.opcheck(TOY.out_variant, (x, y, s, 3.0), test_utils=utils)


@pytest.mark.parametrize("dynamic", [False, True, None])
def test_compiled_functional(dynamic):
    torch._dynamo.reset()
    fn = torch.compile(lambda x: TOY(x * 1.0, 3.0), fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for m in (5, 6, 9):  # a new M: recompiled, or traced once with a symbolic M
        x = x_of(m)
        check(*fn(x), x)


def test_compiled_out_of_unpadded_outputs():
    """out= compiles; the compact clone torch.compile hands the op still gets every visible value."""
    torch._dynamo.reset()
    x = x_of()
    y = torch.full_like(x, POISON)
    s = torch.full((16,), POISON).as_strided((5, 2), (1, 8))

    def fn(x, y, s):
        TOY.out_variant(x, y, s, 3.0)

    torch.compile(fn, fullgraph=True, backend="aot_eager")(x, y, s)
    ref_y, ref_s = _reference(x, 3.0)
    assert torch.equal(y, ref_y) and torch.equal(s, ref_s)


def test_compiled_public_out_of_padded_output_is_refused():
    torch._dynamo.reset()
    x = x_of()
    y, s = torch.empty_like(x), torch.empty(16).as_strided((5, 2), (1, 8))
    fn = torch.compile(lambda x, y, s: TOY(x, 3.0, out=(y, s)), fullgraph=True, backend="aot_eager")
    with pytest.raises(
        Exception, match=r"out\[1\] \(s\): out= with a padded buffer for the toy layout cannot be compiled"
    ):
        fn(x, y, s)


def test_device_must_be_cpu_or_cuda():
    with pytest.raises(ValueError, match=r"^x must be a CUDA or CPU tensor, got device meta$"):
        TOY(torch.empty(5, 8, device="meta"), 3.0)


def test_launch_rows_passes_addresses_and_strides(monkeypatch):
    """The one call of a _C entry every op's launch goes through: x and q as addresses, batch,
    rows and cols from x, strides in elements of x and bytes of q (batch strides 0 for 2-D), then
    the op's own arguments and the stream of x's device."""
    from fp8quant import _ext  # noqa: PLC0415

    monkeypatch.setattr(_ext, "current_device", lambda: -1)  # CPU tensors report device -1
    monkeypatch.setattr(_ext, "raw_stream", lambda device: 0xBEEF)
    calls = []
    x = torch.empty(3, 5, 16, dtype=torch.bfloat16)[:, 1:4]
    q = torch.empty(3, 3, 32, dtype=torch.float8_e4m3fn)[:, :, :16]
    _ext.launch_rows(lambda *args: calls.append(args), x, q, "scale", 7)
    _ext.launch_rows(lambda *args: calls.append(args), x[0], q[0], "scale", 7)
    assert calls == [
        (x.data_ptr(), 2, 3, 3, 16, 80, 16, q.data_ptr(), 96, 32, "scale", 7, 0xBEEF),
        (x[0].data_ptr(), 2, 1, 3, 16, 0, 16, q[0].data_ptr(), 0, 32, "scale", 7, 0xBEEF),
    ]


def test_out_on_the_cpu_takes_one_dimensional_outputs():
    """The CPU path with out= takes 1-D outputs (the routing's counts, row_offsets, ...) as one
    row each: it used to index their missing row dimension (IndexError)."""
    from fp8quant.moe import _routing as routing  # noqa: PLC0415

    ids = torch.randint(-1, 8, (5, 2), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    args = (ids, 8, 0, 4, 5 * 2 + 8 * 3, 5)
    want = routing(*args)
    out = tuple(torch.full(b.shape, -7, dtype=b.dtype) for b in routing.buffers(*args))
    got = routing(*args, out=out)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_signature_from_the_reference():
    """An op's schema is its reference's annotated signature: tensors, then int, float, bool or
    str; anything else, or a tensor after a scalar, is refused naming the parameter."""
    from fp8quant._ops import signature  # noqa: PLC0415

    assert signature(_reference) == (("x",), "float factor")

    def mixed(x: torch.Tensor, w: torch.Tensor, n: int, name: str, on: bool, eps: float):
        pass

    assert signature(mixed) == (("x", "w"), "int n, str name, bool on, float eps")

    def late(x: torch.Tensor, n: int, w: torch.Tensor):
        pass

    def bare(x, n):
        pass

    def scalars_only(n: int):
        pass

    with pytest.raises(TypeError, match=r"late: parameter 'w' must be annotated torch.Tensor \(before the scalars\)"):
        signature(late)
    with pytest.raises(TypeError, match=r"bare: parameter 'x' must be annotated"):
        signature(bare)
    with pytest.raises(TypeError, match=r"scalars_only: an op takes at least one tensor"):
        signature(scalars_only)
