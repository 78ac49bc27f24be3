"""The GPU test harness every op's tests share: bitwise comparison of whole output buffers,
poisoned ``out=`` buffers with guards, the allocating path over a dirtied caching allocator,
side streams, CUDA-graph capture and replay, and the PDL switch.

It knows ops only through their declaration (``fp8quant._ops.Op``): an op's ``buffers(*args)``
gives the geometry of its outputs, which is what "the whole buffer" and "nothing outside"
mean here. A test supplies a ``call(out=None)`` that runs the op on its inputs and the reference
outputs to expect::

    buffers = OP.buffers(x, *params)
    check_op(lambda out=None: OP(x, *params, out=out), reference(x, *params), buffers, x=x)

Poison: every byte of an ``out=`` buffer starts as a value the op never writes (0xA5 bytes; the
NaN 0x7FC0DEAD in 4-byte outputs), with GUARD poisoned elements before and after, so a byte
left unwritten or written out of bounds fails the comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

import fp8quant
from fp8quant._ops import Buffer

FP8 = torch.float8_e4m3fn
GUARD = 64  # poisoned elements before and after every out= buffer (keeps 16-byte alignment)
BYTE_POISON = 0xA5
WORD_POISON = 0x7FC0DEAD  # a NaN as float32; never a valid scale or packed word here

_BITS_DTYPE = {
    FP8: torch.uint8,
    torch.uint8: torch.uint8,
    torch.float32: torch.int32,
    torch.int32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.int16: torch.int16,
    torch.int64: torch.int64,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` reinterpreted as integers of its width (a view: strides are kept)."""
    return t.view(_BITS_DTYPE[t.dtype])


def poison_of(dtype: torch.dtype) -> int:
    """The bit pattern an out= buffer of ``dtype`` starts with."""
    return {1: BYTE_POISON, 2: 0x7FAD, 4: WORD_POISON, 8: 0x5A5A5A5A5A5A5A5A}[dtype.itemsize]


def describe(value: torch.Tensor, dtype: torch.dtype) -> str:
    """One element (0-d tensor of ``dtype``'s bits) as hex bits and value."""
    b = int(value.item())
    if dtype in (FP8, torch.uint8):
        v = torch.tensor([b & 0xFF], dtype=torch.uint8).view(FP8).float().item()
        return f"0x{b & 0xFF:02X} ({v!r})"
    if dtype == torch.int32:  # packed UE8M0 word: four bytes, group 4p first
        b &= 0xFFFFFFFF
        return f"0x{b:08X} (bytes {[(b >> (8 * j)) & 0xFF for j in range(4)]})"
    width = 8 * dtype.itemsize
    b &= (1 << width) - 1
    v = torch.tensor([b - (1 << width) if b >= 1 << (width - 1) else b], dtype=_BITS_DTYPE[dtype]).view(dtype)
    return f"0x{b:0{width // 4}X} ({v.float().item()!r})"


def assert_bitwise_equal(actual, expected, what, *, x=None, locate=None, value_dtype=None) -> None:
    """Fail with the first differing index and both values unless the bits are identical.

    ``x``: the input, reported at the same index (for outputs shaped like it); ``locate``: turns a
    flat index of a whole buffer into words (``"row 5, column 2 (a padding row)"``);
    ``value_dtype``: how to print the elements.
    """
    value_dtype = value_dtype or actual.dtype
    a, e = bits(actual), bits(expected).to(actual.device)
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    differ = a != e
    if not bool(differ.any()):
        return
    where = differ.nonzero()
    first = tuple(where[0].tolist())
    msg = (
        f"{what}: {where.shape[0]} of {a.numel()} elements differ; first at index {first}: "
        f"got {describe(a[first], value_dtype)}, expected {describe(e[first], value_dtype)}"
    )
    if x is not None and tuple(x.shape) == tuple(a.shape):
        msg += f"; input there {describe(bits(x)[first], x.dtype)}"
    if locate is not None and len(first) == 1:
        msg += f"; {locate(first[0])}"
    raise AssertionError(msg)


def whole(t: torch.Tensor, buffer: Buffer) -> torch.Tensor:
    """The output as compared: a row-major output as it is, a strided one as the flat bits of its
    whole buffer (padding included)."""
    if buffer.stride is None:
        return bits(t)
    return bits(t.as_strided((buffer.numel,), (1,)))


def compare_outputs(outs, refs, buffers, label: str, *, x=None, locate=None, written=None, poisoned=False) -> None:
    """Every output bit-identical to the reference's, strided ones over their whole buffer.

    ``written``: for ops that leave parts of their outputs alone (the MoE layouts' rows without
    tokens), one bool tensor per output shaped like ``whole(output)`` (None: every element),
    True where the op writes. Elements it does not write must still hold the poison when the
    outputs were ``poisoned`` (out= buffers), and are not compared otherwise."""
    for i, (o, r, b) in enumerate(zip(outs, refs, buffers, strict=True)):
        got, want = whole(o, b), whole(r, b).to(o.device)
        mask = None if written is None else written[i]
        if mask is not None:
            rest = torch.full_like(got, _fill_value(b.dtype)) if poisoned else got
            want = torch.where(mask.to(o.device), want, rest)
        assert_bitwise_equal(
            got, want, f"{label}: output {i}", x=x if b.stride is None else None,
            locate=locate if b.stride is not None else None, value_dtype=b.dtype,
        )  # fmt: skip


def rows_written(buffers, q_rows: torch.Tensor, scale_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``written`` masks (see compare_outputs) of an op with outputs ``(q [*, M, K], scale)``
    that writes whole rows: ``q_rows`` bool ``[*, M]``, the rows of q it writes; ``scale_rows``
    bool ``[*, rows]``, the rows of the scale layout it writes, its padding rows included."""
    qb, sb = buffers
    q_mask = q_rows.unsqueeze(-1).expand(*q_rows.shape, qb.shape[-1])
    s_mask = torch.zeros(sb.numel, dtype=torch.bool, device=scale_rows.device)
    full = s_mask.as_strided(sb.full_shape, sb.stride)
    full.copy_(scale_rows.unsqueeze(-1).expand(full.shape))
    return q_mask, s_mask


def check_geometry(outs, buffers, device) -> None:
    """Allocated outputs: the declared dtype, shape, strides and a storage that holds the buffer."""
    for i, (o, b) in enumerate(zip(outs, buffers, strict=True)):
        assert o.dtype == b.dtype and tuple(o.shape) == tuple(b.shape) and o.device == device, f"output {i}"
        if b.stride is None:
            assert o.is_contiguous(), f"output {i} is not contiguous: {o.stride()}"
            continue
        assert tuple(o.stride()) == tuple(b.stride), f"output {i} strides {o.stride()}, want {b.stride}"
        need = (o.storage_offset() + b.numel) * o.element_size()
        assert o.untyped_storage().nbytes() >= need, f"output {i}: the buffer does not hold its padding"


@dataclass
class PoisonedOutputs:
    """out= tensors inside poisoned buffers with GUARD elements around them.

    Row-major outputs may get ``row_pad`` extra elements a row and start ``offset`` elements
    after an aligned boundary; strided ones view a buffer of exactly ``numel`` elements.
    """

    outs: tuple[torch.Tensor, ...]
    bufs: tuple[torch.Tensor, ...]  # the flat poisoned buffers, as bits
    buffers: Sequence[Buffer]

    @classmethod
    def new(cls, buffers: Sequence[Buffer], device, *, row_pad: int = 0, offset: int = 0) -> PoisonedOutputs:
        outs, bufs = [], []
        for b in buffers:
            bits_dtype = _BITS_DTYPE[b.dtype]
            if b.stride is None:
                cols = b.shape[-1]
                rows = 1
                for n in b.shape[:-1]:
                    rows *= n
                row_stride = cols + row_pad
                buf = torch.full((2 * GUARD + offset + rows * row_stride,), 0, dtype=bits_dtype, device=device)
                strides = tuple(n * row_stride for n in _suffix_products(b.shape[:-1])) + (1,)
                out = buf.view(b.dtype).as_strided(b.shape, strides, GUARD + offset)
            else:
                buf = torch.full((b.numel + 2 * GUARD,), 0, dtype=bits_dtype, device=device)
                out = buf.view(b.dtype).as_strided(b.shape, b.stride, GUARD)
            bufs.append(buf)
            outs.append(out)
        poisoned = cls(tuple(outs), tuple(bufs), buffers)
        poisoned.repoison()
        return poisoned

    def repoison(self) -> None:
        for buf, b in zip(self.bufs, self.buffers):
            buf.fill_(_fill_value(b.dtype))

    def assert_nothing_written_outside(self) -> None:
        """Elements of the poisoned buffers that the outputs do not cover are still poison."""
        for i, (out, buf, b) in enumerate(zip(self.outs, self.bufs, self.buffers)):
            covered = torch.zeros_like(buf, dtype=torch.bool)
            if b.stride is None:
                covered.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(True)
            else:
                covered[GUARD : GUARD + b.numel] = True
            poison = _fill_value(b.dtype)
            assert bool((buf[~covered] == poison).all()), f"output {i}: the op wrote outside its buffer"


def _suffix_products(dims) -> list[int]:
    """Rows spanned by one step of each leading dimension: (B, M) -> [M, 1]."""
    out, step = [], 1
    for n in reversed(dims):
        out.insert(0, step)
        step *= n
    return out


def _fill_value(dtype: torch.dtype) -> int:
    """The poison pattern as a value of the buffer's bits dtype (uint8, int16 or int32)."""
    pattern, width = poison_of(dtype), 8 * dtype.itemsize
    if _BITS_DTYPE[dtype] == torch.uint8 or pattern < 1 << (width - 1):
        return pattern
    return pattern - (1 << width)


def dirty_allocator(*nbytes: int) -> None:
    """Return poisoned blocks of these sizes to the caching allocator, so that the next
    ``torch.empty`` of the same sizes (an op's outputs) most likely starts out poisoned."""
    blocks = [torch.full((n,), BYTE_POISON, dtype=torch.uint8, device="cuda") for n in nbytes if n > 0]
    del blocks


def buffer_bytes(b: Buffer) -> int:
    if b.stride is not None:
        return b.numel * b.dtype.itemsize
    n = b.dtype.itemsize
    for d in b.shape:
        n *= d
    return n


Call = Callable[..., tuple[torch.Tensor, ...]]  # call(out=None) -> outputs


def check_op(call: Call, refs, buffers, *, x=None, locate=None, out_kwargs=None, written=None):
    """Run the op into poisoned out= buffers, then with allocated outputs over a dirtied
    allocator: both bit-identical to ``refs`` (whole buffers, or the ``written`` parts: see
    compare_outputs), nothing written outside, and the allocated outputs of the declared
    geometry. Returns the allocated outputs."""
    device = refs[0].device if x is None else x.device
    poisoned = PoisonedOutputs.new(buffers, device, **(out_kwargs or {}))
    got = call(out=poisoned.outs)
    assert all(g is o for g, o in zip(got, poisoned.outs)), "out= must return the given tensors"
    compare_outputs(poisoned.outs, refs, buffers, "out=", x=x, locate=locate, written=written, poisoned=True)
    poisoned.assert_nothing_written_outside()

    dirty_allocator(*(buffer_bytes(b) for b in buffers))
    got = call()
    check_geometry(got, buffers, device)
    compare_outputs(got, refs, buffers, "allocated", x=x, locate=locate, written=written)
    return got


def check_side_stream(call: Call, refs, buffers, *, x=None, written=None) -> None:
    """out= and allocating calls enqueued on a non-default stream give the reference bytes."""
    poisoned = PoisonedOutputs.new(buffers, refs[0].device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(out=poisoned.outs)
        got = call()
    side.synchronize()
    compare_outputs(poisoned.outs, refs, buffers, "out= on a side stream", x=x, written=written, poisoned=True)
    compare_outputs(got, refs, buffers, "allocated on a side stream", x=x, written=written)
    poisoned.assert_nothing_written_outside()


def check_graph(
    call: Call, new_inputs: Callable[[], None], reference: Callable[[], tuple], buffers, *, variant: str,
    written: Callable[[], tuple] | None = None,
) -> None:  # fmt: skip
    """Capture ``call`` (into poisoned out= buffers, or allocating), then twice: change the
    inputs in place (``new_inputs``), re-poison the outputs, replay, and compare with
    ``reference()`` of the new inputs (on the parts ``written()`` gives, if given: see
    compare_outputs)."""
    poisoned = PoisonedOutputs.new(buffers, "cuda")

    def run():
        return call(out=poisoned.outs) if variant == "out" else call()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch recommends
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    for replay in range(2):
        new_inputs()
        poisoned.repoison()
        for o, b in zip(outs, buffers):
            whole(o, b).fill_(_fill_value(b.dtype))
        graph.replay()
        torch.cuda.synchronize()
        compare_outputs(outs, reference(), buffers, f"graph replay {replay}",
                        written=None if written is None else written(), poisoned=True)  # fmt: skip
        if variant == "out":
            poisoned.assert_nothing_written_outside()


class pdl_setting:  # noqa: N801 - used like a function: `with pdl_setting(False):`
    """Run a block with programmatic dependent launch on or off, restoring it afterwards."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        self.before = fp8quant.set_pdl(self.enabled)

    def __exit__(self, *exc) -> None:
        fp8quant.set_pdl(self.before)
