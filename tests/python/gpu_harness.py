"""The GPU test harness every op's tests share: bitwise comparison of whole output buffers,
poisoned ``out=`` buffers with guards, the allocating path over a dirtied caching allocator,
side streams, CUDA-graph capture and replay, the PDL switch, a PDL producer that writes an op's
inputs late (check_pdl_producer), and the structure of an eager call (assert_direct_eager_call:
no dispatcher round trip, only the outputs allocated; also on the CPU).

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

import pytest
import torch

import fp8quant
from fp8quant._ops import Buffer

try:  # the PDL producer is a Triton kernel (torch's CUDA wheels bring Triton)
    import triton
    import triton.language as tl
    import triton.language.extra.cuda
except ImportError:
    triton = None

FP8 = torch.float8_e4m3fn
GUARD = 64  # poisoned elements before and after every out= buffer (keeps 16-byte alignment)
BYTE_POISON = 0xA5
WORD_POISON = 0x7FC0DEAD  # a NaN as float32; never a valid scale or packed word here

_BITS_DTYPE = {
    FP8: torch.uint8,
    torch.float8_e8m0fnu: torch.uint8,
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


def nan_past_counts(x: torch.Tensor, masked_m: torch.Tensor) -> None:
    """NaN in every row of batch e at or past masked_m[e] (x: [batches, max_m, ...]): the rows
    a masked launch must never read."""
    x[torch.arange(x.shape[1], device=x.device) >= masked_m.unsqueeze(1)] = float("nan")


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
    """out= and allocating calls enqueued on a non-default stream give the reference bytes, and
    are enqueued there: while they run and their outputs are compared (on the side stream), a
    StreamGate holds the default stream, so a kernel launched on the default stream instead
    would still be waiting and its out= buffers would hold the poison. A first round without
    the gate (synchronized before comparing) loads the op's kernels and fills the side stream's
    allocator cache: lazy module loading and device memory allocation may wait for running
    kernels. A call that waits for the default stream makes the gate time out, and fails."""
    if _TRITON_MISSING:
        pytest.skip(_TRITON_MISSING)
    device = refs[0].device
    poisoned = PoisonedOutputs.new(buffers, device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    gate = StreamGate()

    def run(gated: bool) -> None:
        poisoned.repoison()
        torch.cuda.synchronize(device)
        if gated:
            gate.close(torch.cuda.default_stream(device))
        try:
            with torch.cuda.stream(side):
                call(out=poisoned.outs)
                got = call()
                if not gated:
                    torch.cuda.synchronize(device)
                label = "gated " if gated else ""
                compare_outputs(poisoned.outs, refs, buffers, f"{label}out= on a side stream", x=x, written=written,
                                poisoned=True)  # fmt: skip
                compare_outputs(got, refs, buffers, f"{label}allocated on a side stream", x=x, written=written)
                poisoned.assert_nothing_written_outside()
                del got
        finally:
            gate.open()
        torch.cuda.synchronize(device)
        assert not gate.timed_out(), "the calls on the side stream waited for the default stream"

    run(gated=False)
    run(gated=True)


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


class pdl_setting:
    """Run a block with programmatic dependent launch on or off, restoring it afterwards."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        self.before = fp8quant.set_pdl(self.enabled)

    def __exit__(self, *exc) -> None:
        fp8quant.set_pdl(self.before)


# --------------------------------------------------------------------------------------------
# The eager path: no dispatcher round trip, only the outputs allocated
# --------------------------------------------------------------------------------------------

ALLOCATING_OPS = ("aten::empty", "aten::empty_strided")
VIEW_OPS = ("aten::as_strided",)


def dispatcher_ops(call: Callable[[], object]) -> list[str]:
    """The operators ``call()`` runs through torch's dispatcher, in order: torch.profiler's CPU
    events named ``namespace::op`` (every dispatched operator, custom ops included, records one;
    the profiler also records CUDA runtime calls such as ``cudaLaunchKernelExC``, which are not
    operators)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return [e.name for e in prof.events() if "::" in e.name]


def assert_direct_eager_call(call: Callable[[], object], outputs: int) -> None:
    """``call()``, an op's eager call on plain tensors, runs no operator through the dispatcher
    but the allocation of its ``outputs`` outputs (and views of them): no ``fp8quant::`` op (a
    dispatcher round trip) and no temporary. On CUDA tensors it also makes exactly ``outputs``
    requests to the caching allocator. Structure, not time: what ``python -m fp8quant bench
    --host-overhead`` times, held without a clock. ``call`` runs once first (geometry caches)."""
    result = call()
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in (result if isinstance(result, tuple) else (result,)))
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        kept = call()
        requests = torch.cuda.memory_stats()["allocation.all.allocated"] - before
        del kept
    names = dispatcher_ops(call)
    routed = [n for n in names if n.startswith("fp8quant::")]
    assert not routed, f"the eager call went through the dispatcher: {routed} (all: {names})"
    others = [n for n in names if n not in ALLOCATING_OPS + VIEW_OPS]
    assert not others, f"the eager call dispatches {others} besides allocating its outputs"
    allocations = [n for n in names if n in ALLOCATING_OPS]
    assert len(allocations) == outputs, f"{len(allocations)} allocations ({names}), expected one per output ({outputs})"
    if cuda:
        assert requests == outputs, f"{requests} CUDA allocations, expected one per output ({outputs})"


# --------------------------------------------------------------------------------------------
# A gate: a kernel that holds a stream until the host opens it
# --------------------------------------------------------------------------------------------

GATE_TIMEOUT_NS = 20_000_000_000  # never opened (the host waited for the gated stream): give up, and say so

if triton is not None:

    @triton.jit
    def _gate(flag, timeout_ns):
        """Spin until the host sets flag[0] (pinned host memory); flag[1] = 1 if it never did
        within timeout_ns."""
        start = tl.extra.cuda.globaltimer()
        now = start
        go = tl.load(flag, volatile=True)
        while (go == 0) & (now - start < timeout_ns):
            go = tl.load(flag, volatile=True)
            now = tl.extra.cuda.globaltimer()
        if go == 0:
            tl.store(flag + 1, 1)

    _TRITON_MISSING = None
else:
    _TRITON_MISSING = "the stream gate is a Triton kernel (torch's CUDA wheels bring Triton)"


class StreamGate:
    """``close(stream)`` enqueues a one-program kernel on ``stream`` that spins until ``open()``
    (a flag in pinned host memory): work enqueued behind it on that stream waits meanwhile."""

    def __init__(self) -> None:
        self.flag = torch.zeros(2, dtype=torch.int32, pin_memory=True)

    def close(self, stream: torch.cuda.Stream) -> None:
        self.flag.zero_()
        with torch.cuda.stream(stream):
            _gate[(1,)](self.flag, GATE_TIMEOUT_NS)

    def open(self) -> None:
        self.flag[0] = 1

    def timed_out(self) -> bool:
        return bool(self.flag[1])


# --------------------------------------------------------------------------------------------
# PDL: a producer that lets the op launch at once and writes the op's inputs late
# --------------------------------------------------------------------------------------------

PRODUCER_PROGRAMS = 4  # few enough to be resident at once, so that all of them trigger the op's launch
PRODUCER_DELAY_NS = 1_000_000  # after the host's go: the window in which an op that skips its wait reads stale input
PRODUCER_TIMEOUT_NS = 5_000_000_000  # no go from the host (the call waited for the stream): give up, and say so
COPY_BLOCK = 4096  # bytes a program copies per step

if triton is not None and hasattr(tl.extra.cuda, "gdc_launch_dependents"):

    @triton.jit
    def _late_producer(table, copies, flag, delay_ns, timeout_ns, BLOCK: tl.constexpr):
        """Let the next kernel launch at once (griddepcontrol.launch_dependents); wait for the
        host's go (flag[0], pinned host memory; flag[1] = 1 if it never came) and delay_ns more;
        then run the copies of ``table``, int64 rows (destination, source, bytes)."""
        tl.extra.cuda.gdc_launch_dependents()
        _gate(flag, timeout_ns)
        end = tl.extra.cuda.globaltimer() + delay_ns
        while tl.extra.cuda.globaltimer() < end:
            pass
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK
        for c in range(copies):
            dst = tl.load(table + 3 * c).to(tl.pointer_type(tl.uint8))
            src = tl.load(table + 3 * c + 1).to(tl.pointer_type(tl.uint8))
            n = tl.load(table + 3 * c + 2)
            for first in range(pid * BLOCK, n, step):
                idx = first + tl.arange(0, BLOCK)
                tl.store(dst + idx, tl.load(src + idx, mask=idx < n), mask=idx < n)

    @triton.jit
    def _copy_without_wait(dst, src, n, BLOCK: tl.constexpr):
        """The control: copies ``n`` bytes without griddepcontrol.wait, so that, launched with PDL
        behind the producer, it reads what the input holds before the producer writes it."""
        step = tl.num_programs(0) * BLOCK
        for first in range(tl.program_id(0) * BLOCK, n, step):
            idx = first + tl.arange(0, BLOCK)
            tl.store(dst + idx, tl.load(src + idx, mask=idx < n), mask=idx < n)

    _PRODUCER_MISSING = None
else:
    _PRODUCER_MISSING = "the PDL producer needs Triton with tl.extra.cuda.gdc_launch_dependents (Triton >= 3.3)"


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, flat (a view)."""
    assert t.is_contiguous(), "the PDL producer writes whole contiguous tensors"
    return t.reshape(-1).view(torch.uint8)


class LateProducer:
    """The producer kernel with its copies fixed (``(destination, source)`` tensor pairs) and its
    go flag in pinned host memory. ``launch()`` enqueues it on the current stream (also into a
    CUDA graph being captured); ``go()`` lets it proceed."""

    def __init__(self, copies: Sequence[tuple[torch.Tensor, torch.Tensor]], device) -> None:
        rows = [(d.data_ptr(), s.data_ptr(), d.numel() * d.element_size()) for d, s in copies]
        for (d, s), (_, _, n) in zip(copies, rows):
            assert d.is_contiguous() and s.is_contiguous() and s.numel() * s.element_size() == n
        self.table = torch.tensor(rows, dtype=torch.int64, device=device).reshape(-1)
        self.copies = len(rows)
        self.flag = torch.zeros(2, dtype=torch.int32, pin_memory=True)

    def arm(self) -> None:
        self.flag.zero_()

    def launch(self) -> None:
        _late_producer[(PRODUCER_PROGRAMS,)](self.table, self.copies, self.flag, PRODUCER_DELAY_NS,
                                             PRODUCER_TIMEOUT_NS, BLOCK=COPY_BLOCK)  # fmt: skip

    def go(self) -> None:
        self.flag[0] = 1

    def timed_out(self) -> bool:
        return bool(self.flag[1])


def check_pdl_producer(
    call: Call, inputs: Sequence[torch.Tensor], stale: Sequence[torch.Tensor], refs, buffers, *,
    written=None, after: Callable[[str], None] | None = None,
) -> None:  # fmt: skip
    """An op behind a PDL producer that writes its inputs late (the quantizer's, also in C:
    tests/cpp/test_pdl.cu).

    ``inputs``: every tensor the op reads (contiguous), holding the values ``refs`` are the
    outputs for; ``stale``: other values of the same shapes (a valid input too: another routing,
    not garbage). A producer kernel lets the next kernel launch at once, waits until the host has
    enqueued the op (a go flag, so no timing decides it) and PRODUCER_DELAY_NS more, then copies
    each input's final values over its stale ones and copies the op's poisoned out= buffers
    aside. The op, enqueued right behind it with ``call(out=...)``, must give ``refs`` (on the
    parts ``written`` names: compare_outputs), and the copies of its buffers must hold only the
    poison: it neither read its inputs nor wrote its outputs before its griddepcontrol.wait. On
    a stream and replayed twice from a CUDA graph, with PDL on and off; ``after(label)`` checks
    inputs the op updates in place. Two controls show the test can fail: the stale input gives
    other outputs, and a kernel launched with PDL that does not wait reads the stale input.
    A call that waits for the stream (a device-to-host read) fails with a message, after
    PRODUCER_TIMEOUT_NS, instead of hanging.
    """
    if _PRODUCER_MISSING:
        pytest.skip(_PRODUCER_MISSING)
    device = inputs[0].device
    assert not torch.equal(as_bytes(stale[0]), as_bytes(inputs[0])), "the control needs a stale first input"
    final = [t.clone() for t in inputs]
    poisoned = PoisonedOutputs.new(buffers, device)
    snapshots = [torch.empty_like(b) for b in poisoned.bufs]
    producer = LateProducer([(s, b) for s, b in zip(snapshots, poisoned.bufs)] + list(zip(inputs, final)), device)

    def set_stale() -> None:
        for t, s in zip(inputs, stale, strict=True):
            t.copy_(s)
        poisoned.repoison()
        for s in snapshots:
            s.zero_()  # never the poison: a copy that did not run fails the check
        torch.cuda.synchronize()

    # The stale input gives other outputs (this also loads the op's kernels before any window:
    # lazy module loading waits for running kernels)
    set_stale()
    call(out=poisoned.outs)
    torch.cuda.synchronize()
    try:
        compare_outputs(poisoned.outs, refs, buffers, "stale input", written=written, poisoned=True)
    except AssertionError:
        pass
    else:
        raise AssertionError("the op gives the same outputs for the stale input: this test cannot catch a stale read")

    # The control: launched with PDL behind the producer, a kernel that does not wait reads the
    # stale input. A first round with the go given at once compiles and loads both kernels.
    seen = torch.empty_like(as_bytes(inputs[0]))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for warm_up in (True, False):
        set_stale()
        producer.arm()
        if warm_up:
            producer.go()
        try:
            producer.launch()
            _copy_without_wait[(sms,)](seen, as_bytes(inputs[0]), seen.numel(), BLOCK=COPY_BLOCK, launch_pdl=True)
        finally:
            producer.go()  # also when a launch failed: the producer must not hold the stream
        torch.cuda.synchronize()
    stale_seen = int((seen == as_bytes(stale[0])).sum())
    assert stale_seen == seen.numel() and not producer.timed_out(), (
        f"the control kernel read {stale_seen} of {seen.numel()} bytes before the producer wrote them: "
        "this test could not catch a missing wait"
    )

    def run(label: str, enqueue: Callable[[], object]) -> None:
        set_stale()
        producer.arm()
        try:
            enqueue()
        finally:
            producer.go()
        torch.cuda.synchronize()
        assert not producer.timed_out(), f"{label}: the producer never got its go: the call waited for the stream"
        for i, (snap, b) in enumerate(zip(snapshots, buffers)):
            early = not bool((snap == _fill_value(b.dtype)).all())
            assert not early, f"{label}: output {i} was written before the producer read it"
        compare_outputs(poisoned.outs, refs, buffers, label, written=written, poisoned=True)
        poisoned.assert_nothing_written_outside()
        if after is not None:
            after(label)

    def producer_then_op() -> None:
        producer.launch()
        call(out=poisoned.outs)

    for pdl in (True, False):
        with pdl_setting(pdl):
            name = f"PDL {'on' if pdl else 'off'}"
            run(f"{name}, stream", producer_then_op)
            graph = torch.cuda.CUDAGraph()
            set_stale()
            with torch.cuda.graph(graph):
                producer_then_op()
            for replay in range(2):
                run(f"{name}, graph replay {replay}", graph.replay)
