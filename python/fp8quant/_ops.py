"""The pattern every fp8quant op follows: one declaration gives a functional op and an ``out=``
op, both registered with ``torch.library`` (so ``torch.compile``, fake tensors and CUDA graphs
see them), and an eager path that skips the dispatcher.

An op declares its reference, whose annotated signature is the op's (tensor inputs first, then
``int``, ``float``, ``bool`` or ``str`` parameters), its outputs, their geometry and a CUDA
launch::

    def reference_op(x: torch.Tensor, group_size: int, scale_layout: str, ue8m0: bool, eps: float):
        ...                        # -> outputs (the CPU path and the oracle)

    quant = Op(
        "per_token_group_quant",
        ("q", "scale"),            # the outputs
        quant_geometry,            # (TensorMeta of each input, *params) -> (Buffer, ...)
        launch_on_gpu,             # (*inputs, *outputs, *params) -> None, writes the outputs
        reference_op,
    )
    q, scale = quant(x, 128, "mn_tma", False, 1e-4)            # allocates
    quant(x, 128, "mn_tma", False, 1e-4, out=(q, scale))        # into caller buffers

An input the launch updates in place (a residual) is named in ``mutates``: the registered ops
declare it mutated, and the reference returns its new value after the outputs.

Eager calls on plain tensors (nn.Parameter too; the common case in engines running prefill or decode without
capture) check ``out=`` tensors, allocate and launch directly: a Python custom op's dispatch costs
more host time than the kernel takes. Traced calls (``torch.compile``, ``make_fx``, fake tensors,
a dispatch mode) go through the registered ops. Both run the same launch, so they give the same
bytes. Argument values are the C API's to judge on the GPU path; an op's public function checks
only what it needs to compute its outputs' geometry, and what the reference needs on the CPU.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.utils._device import DeviceContext

__all__ = ["Buffer", "Op", "TensorMeta", "tracing"]


class TensorMeta(NamedTuple):
    """What an op's geometry may depend on: an input's shape and dtype (hashable when eager)."""

    shape: tuple
    dtype: torch.dtype


@dataclass(frozen=True)
class Buffer:
    """Geometry of one output.

    ``shape`` and ``dtype`` are those of the tensor handed back. ``stride=None`` means a
    row-major output: allocated contiguous, while ``out=`` may have any row and batch strides
    that keep the last dimension contiguous and rows apart (the kernels take them). Otherwise
    ``stride`` is exact and ``numel`` is the size of the buffer behind the view, padding
    included: the kernels write all of it, so an ``out=`` tensor's storage must hold it.
    ``full_shape``, where given, is the shape of a view with ``stride`` over the whole buffer
    (padding rows included): allocation is then one ``empty_strided`` and, where the shapes
    differ, a view of the visible part. ``context`` ends the messages about a wrong ``out=`` tensor
    (``"for scale_layout='mn'"``).
    """

    dtype: torch.dtype
    shape: tuple
    stride: tuple | None = None
    numel: int | None = None
    context: str = ""
    full_shape: tuple | None = None

    @property
    def padded(self) -> bool:
        """Whether the buffer reaches past the view's last element (padding rows)."""
        if self.stride is None:
            return False
        extent = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) if all(self.shape) else 0
        return self.numel > extent

    def __post_init__(self) -> None:
        # Plain tuples for allocation: torch parses them faster than a torch.Size
        shape = tuple(self.shape)
        object.__setattr__(self, "_shape", shape)
        contiguous, step = [], 1
        for n in reversed(shape):
            contiguous.insert(0, step)
            step *= n
        object.__setattr__(self, "_contiguous", tuple(contiguous))

    @classmethod
    def contiguous(cls, dtype: torch.dtype, shape: tuple, context: str) -> Buffer:
        """An output that must be exactly ``shape``, contiguous (block scales, scale byte
        matrices): ``out=`` tensors are held to those strides, not only to a contiguous last
        dimension."""
        stride, numel = [], 1
        for size in reversed(shape):
            stride.insert(0, numel)
            numel *= size
        return cls(dtype, shape, tuple(stride), numel, context, full_shape=shape)

    def empty(self, device: torch.device) -> torch.Tensor:
        """A new uninitialised output (``empty_strided`` is torch's cheapest allocation call)."""
        if self.stride is None:
            return torch.empty_strided(self._shape, self._contiguous, dtype=self.dtype, device=device)
        if self.full_shape is None:
            return torch.empty(self.numel, dtype=self.dtype, device=device).as_strided(self._shape, self.stride)
        t = torch.empty_strided(self.full_shape, self.stride, dtype=self.dtype, device=device)
        return t if self.full_shape == self._shape else t.as_strided(self._shape, self.stride)


def tracing() -> bool:
    """Whether calls are being traced: by ``torch.compile``, or under a dispatch or function mode
    (``make_fx``, ``FakeTensorMode``, ...). ``with torch.device(...)`` is a function mode too, one
    that only fills in the device of factory calls: it is not tracing."""
    return (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack() > 0
        or (torch._C._is_torch_function_mode_enabled() and _function_mode_other_than_device())
    )


def _function_mode_other_than_device() -> bool:
    """A torch-function mode is active that is not a ``torch.device`` context."""
    return not all(
        isinstance(torch._C._get_function_stack_at(i), DeviceContext)
        for i in range(torch._C._len_torch_function_stack())
    )


# Tensor types the eager path takes as they are: torch.Tensor, and subclasses that override neither
# __torch_function__ nor __torch_dispatch__ (nn.Parameter, ...), whose calls reach the
# kernels unchanged. Subclasses that do (FakeTensor, FunctionalTensor, DTensor, ...) go through the
# registered ops. Decided once per type.
_PLAIN_TYPES: dict[type, bool] = {torch.Tensor: True}
_DEFAULT_TORCH_FUNCTIONS = (torch._C._disabled_torch_function_impl, torch.Tensor.__torch_function__.__func__)


def _plain(t) -> bool:
    """``t`` is a tensor the eager path runs on directly (see _PLAIN_TYPES)."""
    cls = type(t)
    plain = _PLAIN_TYPES.get(cls)
    if plain is None:
        function = getattr(cls, "__torch_function__", None)
        plain = _PLAIN_TYPES[cls] = (
            issubclass(cls, torch.Tensor)
            and getattr(function, "__func__", function) in _DEFAULT_TORCH_FUNCTIONS
            and cls.__torch_dispatch__ is torch._C._disabled_torch_dispatch_impl
        )
    return plain


def _strides_match(t: torch.Tensor, buf: Buffer) -> bool:
    """``t`` has the buffer's strides (those of size-1 dimensions do not matter)."""
    return all(n <= 1 or s == want for n, s, want in zip(buf.shape, t.stride(), buf.stride))


def _holds(t: torch.Tensor, buf: Buffer) -> bool:
    """``t``'s storage holds the whole buffer from ``t``'s first element."""
    return t.untyped_storage().nbytes() >= (t.storage_offset() + buf.numel) * t.element_size()


def _rows_apart(t: torch.Tensor) -> bool:
    """A row-major ``[..., rows, cols]`` tensor whose rows and batches share no element (a 1-D
    one, its last dimension contiguous, is a single row)."""
    if t.numel() == 0 or t.dim() < 2:
        return True
    rows, cols = t.shape[-2], t.shape[-1]
    row_span = (rows - 1) * t.stride(-2) + cols
    return (rows <= 1 or t.stride(-2) >= cols) and (t.dim() < 3 or t.shape[0] <= 1 or t.stride(0) >= row_span)


def _byte_range(t: torch.Tensor, numel: int | None) -> tuple[int, int]:
    if numel is None:
        numel = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    return t.data_ptr(), t.data_ptr() + numel * t.element_size()


_TENSOR = ("Tensor", "torch.Tensor")
_SCALARS = ("int", "float", "bool", "str")


def signature(reference: Callable) -> tuple[tuple[str, ...], str]:
    """An op's tensor inputs and the schema fragment of its scalar parameters, read from its
    reference's annotations: tensors first, then ``int``, ``float``, ``bool`` or ``str``."""
    inputs, params = [], []
    for name, p in inspect.signature(reference).parameters.items():
        annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", None)
        if annotation in _TENSOR and not params:
            inputs.append(name)
        elif annotation in _SCALARS:
            params.append(f"{annotation} {name}")
        else:
            raise TypeError(
                f"{reference.__qualname__}: parameter {name!r} must be annotated torch.Tensor (before the scalars) "
                f"or one of {', '.join(_SCALARS)}, got {p.annotation!r}"
            )
    if not inputs:
        raise TypeError(f"{reference.__qualname__}: an op takes at least one tensor")
    return tuple(inputs), ", ".join(params)


class Op:
    """One fp8quant operation, declared once (see the module docstring)."""

    def __init__(
        self,
        name: str,
        outputs: tuple[str, ...],
        geometry: Callable[..., tuple[Buffer, ...]],
        launch: Callable[..., None],
        reference: Callable[..., tuple[torch.Tensor, ...]],
        *,
        mutates: tuple[str, ...] = (),
        namespace: str = "fp8quant",
    ) -> None:
        inputs, params = signature(reference)
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self._geometry = geometry
        self._geometry_cache: dict[tuple, tuple[Buffer, ...]] = {}  # by input shapes, dtypes and params
        self._n_in = len(inputs)
        self._n_out = len(outputs)
        self._launch = launch
        self._reference = reference
        self._labels = tuple(f"out[{i}] ({o})" for i, o in enumerate(outputs))
        self._mutated = tuple(inputs.index(name) for name in mutates)

        alias = iter("abcdefghijklmnopqrstuvwxyz")
        ins = ", ".join(f"Tensor({next(alias)}!) {i}" if i in mutates else f"Tensor {i}" for i in inputs)
        params = f", {params}" if params else ""
        rets = ", ".join("Tensor" for _ in outputs)  # one output: "(Tensor)" is a lone Tensor
        self.functional = torch.library.custom_op(
            f"{namespace}::{name}",
            self._functional_impl,
            mutates_args=mutates,
            schema=f"({ins}{params}) -> ({rets})",
        )
        self.functional.register_fake(self._fake_impl)
        outs = ", ".join(f"Tensor({next(alias)}!) {o}" for o in outputs)
        self.out_variant = torch.library.custom_op(
            f"{namespace}::{name}_out",
            self._out_impl,
            mutates_args=(*mutates, *outputs),
            schema=f"({ins}, {outs}{params}) -> ()",
        )
        self.out_variant.register_fake(lambda *args: None)

    # --- the public call ----------------------------------------------------------------------

    def __call__(self, *args, out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
        """Run the op on ``args`` (inputs, then parameters, in declaration order), into new
        outputs or into ``out``."""
        n_in = self._n_in
        x = args[0]
        if not (x.is_cuda or x.is_cpu):
            raise ValueError(f"{self.inputs[0]} must be a CUDA or CPU tensor, got device {x.device}")
        inputs = args[:n_in]
        if n_in == 1:
            plain = type(x) is torch.Tensor or _plain(x)
        else:
            plain = all(type(t) is torch.Tensor or _plain(t) for t in inputs)
        if plain and not tracing():
            buffers = self._eager_geometry(args)
            if out is None:
                device = x.device
                outs = tuple([b.empty(device) for b in buffers])
            elif self._matches(out, buffers, x):
                outs = tuple(out)
            else:
                outs = self._check_out(out, buffers, inputs, traced=False)
            if x.is_cuda:
                self._launch(*inputs, *outs, *args[n_in:])
            else:
                if out is None and self._mutated:  # with out=, _check_out did
                    _check_apart(self.inputs, inputs, self._mutated, (), (), ())
                self._run(inputs, outs, args[n_in:], buffers)
            return outs
        if out is None:
            result = self.functional(*args)
            return result if self._n_out > 1 else (result,)
        outs = self._check_out(out, self._buffers(inputs, args[n_in:]), inputs, traced=True)
        self.out_variant(*inputs, *outs, *args[n_in:])
        return outs

    def _eager_geometry(self, args) -> tuple[Buffer, ...]:
        """The geometry for concrete arguments, remembered by input shapes, dtypes and params."""
        n_in = self._n_in
        key = (*[(t.shape, t.dtype) for t in args[:n_in]], *args[n_in:])
        buffers = self._geometry_cache.get(key)
        if buffers is None:
            if len(self._geometry_cache) >= 4096:
                self._geometry_cache.clear()
            buffers = self._geometry_cache[key] = self._buffers(args[:n_in], args[n_in:])
        return buffers

    @staticmethod
    def _matches(out, buffers, x) -> bool:
        """The common case, checked quickly: CUDA outputs with exactly the declared dtype, shape
        and strides, on x's device, over a storage that holds each buffer (the C API checks the
        rest). Anything else takes _check_out, which says what is wrong."""
        if not (isinstance(out, (tuple, list)) and len(out) == len(buffers)) or not x.is_cuda:
            return False
        device = x.get_device()
        for t, b in zip(out, buffers):
            if not (
                isinstance(t, torch.Tensor) and t.dtype == b.dtype and t.shape == b.shape and t.get_device() == device
            ):
                return False
            if b.stride is None:
                if t.stride(-1) != 1:
                    return False
            elif t.stride() != b.stride or not _holds(t, b):
                return False
        return True

    # --- the registered ops ---------------------------------------------------------------------

    def buffers(self, *args) -> tuple[Buffer, ...]:
        """The geometry of the outputs for ``args`` (inputs, then parameters)."""
        return self._buffers(args[: self._n_in], args[self._n_in :])

    def _buffers(self, inputs, params) -> tuple[Buffer, ...]:
        return self._geometry(*(TensorMeta(t.shape, t.dtype) for t in inputs), *params)

    def _functional_impl(self, *args):
        inputs, params = args[: self._n_in], args[self._n_in :]
        buffers = self._buffers(inputs, params)
        outs = tuple(b.empty(inputs[0].device) for b in buffers)
        self._run(inputs, outs, params, buffers)
        return outs if self._n_out > 1 else outs[0]

    def _fake_impl(self, *args):
        inputs, params = args[: self._n_in], args[self._n_in :]
        outs = tuple(b.empty(inputs[0].device) for b in self._buffers(inputs, params))
        return outs if self._n_out > 1 else outs[0]

    def _out_impl(self, *args) -> None:
        n_in, n_out = self._n_in, len(self.outputs)
        inputs, outs, params = args[:n_in], args[n_in : n_in + n_out], args[n_in + n_out :]
        buffers = self._buffers(inputs, params)
        # torch.compile hands a mutated argument over as a compact clone, without the padding a
        # strided buffer holds: run into a whole buffer and copy the visible part back
        targets = tuple(
            o if b.stride is None or (_strides_match(o, b) and _holds(o, b)) else b.empty(o.device)
            for o, b in zip(outs, buffers)
        )
        self._run(inputs, targets, params, buffers)
        for o, t in zip(outs, targets):
            if t is not o:
                o.copy_(t)

    # --- running and checking -------------------------------------------------------------------

    def _run(self, inputs, outs, params, buffers) -> None:
        if inputs[0].device.type == "cuda":
            self._launch(*inputs, *outs, *params)
            return
        # CPU: the reference, copied whole (padding included) into the outputs, and the new
        # values of the inputs updated in place
        results = self._reference(*inputs, *params)
        for o, r, b in zip(outs, results, buffers):
            if b.stride is None:
                o.copy_(r)
            else:
                o.as_strided((b.numel,), (1,)).copy_(r.as_strided((b.numel,), (1,)))
        for i, r in zip(self._mutated, results[len(outs) :]):
            inputs[i].copy_(r)

    def _check_out(self, out, buffers, inputs, *, traced: bool) -> tuple[torch.Tensor, ...]:
        """The caller's output tensors, checked against the geometry the op would allocate."""
        n = len(self.outputs)
        names = ", ".join(self.outputs)
        if not (isinstance(out, (tuple, list)) and len(out) == n):
            raise TypeError(f"out must be a ({names}) {'pair' if n == 2 else 'tuple'} of tensors")
        device = inputs[0].device
        for label, t, b in zip(self._labels, out, buffers):
            ctx = f" {b.context}" if b.context else ""
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
            if t.device != device:
                raise ValueError(
                    f"{label} is on {t.device}, {self.inputs[0]} on {device}: all tensors must be on one device"
                )
            if t.dtype != b.dtype:
                raise TypeError(f"{label} must be {b.dtype}{ctx}, got {t.dtype}")
            if tuple(t.shape) != tuple(b.shape):
                raise ValueError(f"{label} must have shape {tuple(b.shape)}{ctx}, got {tuple(t.shape)}")
            if b.stride is None:
                if t.numel() > 0 and t.stride(-1) != 1:
                    raise ValueError(f"{label} must have a contiguous last dimension, got strides {tuple(t.stride())}")
                continue
            if not _strides_match(t, b):
                raise ValueError(f"{label} must have strides {tuple(b.stride)}{ctx}, got {tuple(t.stride())}")
            if traced:
                if b.padded:
                    raise ValueError(
                        f"{label}: out= with a padded buffer{ctx} cannot be compiled: torch.compile clones a mutated "
                        "input without the padding rows the kernel writes; call the op without out= in compiled code"
                    )
            elif b.numel > 0 and not _holds(t, b):
                need = (t.storage_offset() + b.numel) * t.element_size()
                raise ValueError(
                    f"{label} needs {need} bytes of storage from its start (padding included){ctx}, its "
                    f"storage holds {t.untyped_storage().nbytes()}; allocate the whole buffer "
                    "(fp8quant.empty_scale() does for scales)"
                )
        if not traced and device.type == "cpu":
            _check_apart(self.inputs, inputs, self._mutated, self._labels, out, buffers)  # the C API does on the GPU
        return tuple(out)


def _check_apart(input_names, inputs, mutated, labels, outs, buffers) -> None:
    """What the op writes (its outputs and the inputs it updates in place) shares no byte with
    anything else it touches, and row-major outputs and the inputs it updates in place (rows, like
    the residual) not with themselves."""
    written = [(input_names[i], inputs[i]) for i in mutated]
    written += [(label, t) for label, t, b in zip(labels, outs, buffers) if b.stride is None]
    for name, t in written:
        if not _rows_apart(t):
            raise ValueError(f"{name} must not overlap itself, got strides {tuple(t.stride())}")
    named = [(n, t, None, i in mutated) for i, (n, t) in enumerate(zip(input_names, inputs))]
    named += [(label, t, b.numel, True) for label, t, b in zip(labels, outs, buffers)]
    spans = [
        (name, t.untyped_storage().data_ptr(), _byte_range(t, numel), written) for name, t, numel, written in named
    ]
    for i, (name_a, storage_a, (lo_a, hi_a), written_a) in enumerate(spans):
        for name_b, storage_b, (lo_b, hi_b), written_b in spans[i + 1 :]:
            if (written_a or written_b) and storage_a == storage_b and lo_a < hi_b and lo_b < hi_a:
                raise ValueError(
                    f"{name_b} overlaps {name_a}: what the op writes must not share memory with anything else it reads "
                    "or writes"
                )
