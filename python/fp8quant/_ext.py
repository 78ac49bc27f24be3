"""The compiled extension (``fp8quant._C``) and what every op's CUDA launch shares: the call of
a ``_C`` entry on a tensor's device and current stream, and the programmatic-dependent-launch
switch."""

from __future__ import annotations

import importlib

import torch

__all__ = [
    "DTYPE_CODES",
    "LAYOUT_CODES",
    "current_device",
    "extension",
    "launch",
    "launch_rows",
    "pdl_enabled",
    "raw_stream",
    "set_pdl",
]

#: fp8quant_dtype_t of each input dtype.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: fp8quant_scale_layout_t of each scale layout.
LAYOUT_CODES = {"row": 0, "mn": 1, "mn_tma": 2, "packed_ue8m0": 3}

try:
    _C = importlib.import_module(f"{__package__}._C")
except ImportError as exc:  # the package still serves the reference on CPU
    _C = None
    _C_IMPORT_ERROR: ImportError | None = exc
else:
    _C_IMPORT_ERROR = None

# The current stream of a device as an address, without building a torch.cuda.Stream object
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream
)


# The current CUDA device's index (torch.cuda.current_device() without its Python layers)
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def extension():
    """The extension module; RuntimeError with the import's reason when it is missing."""
    if _C is None:
        raise RuntimeError(
            "fp8quant's CUDA extension (fp8quant._C) could not be imported, so CUDA tensors cannot "
            f"be quantized: {_C_IMPORT_ERROR}"
        )
    return _C


def launch(entry, device: int, *args) -> None:
    """Call the ``_C`` entry ``entry(*args, stream)`` on CUDA device ``device`` (an index) with
    that device's current stream."""
    if device != current_device():
        with torch.cuda.device(device):
            return launch(entry, device, *args)
    entry(*args, raw_stream(device))
    return None


def launch_rows(entry, x: torch.Tensor, q: torch.Tensor, *rest, dtype_code: bool = True) -> None:
    """Call a ``_C`` entry that quantizes ``x`` (``[rows, cols]`` or ``[batch, rows, cols]``) into
    the like-shaped ``q``, on x's device and its current stream:
    ``entry(x, x_dtype, batch, rows, cols, x_batch_stride, x_row_stride, q, q_batch_stride,
    q_row_stride, *rest, stream)``, tensors as addresses, strides in elements (bytes of q);
    without ``x_dtype`` when ``dtype_code`` is False (an entry that takes one input dtype).
    Written out rather than through :func:`launch`: it is every quantizer call's host path."""
    device = x.get_device()
    if device != current_device():
        with torch.cuda.device(device):
            return launch_rows(entry, x, q, *rest, dtype_code=dtype_code)
    shape, xs, qs = x.shape, x.stride(), q.stride()
    if len(shape) == 2:
        batch, x_batch, q_batch = 1, 0, 0
    else:
        batch, x_batch, q_batch = shape[0], xs[0], qs[0]
    if dtype_code:
        entry(
            x.data_ptr(), DTYPE_CODES[x.dtype], batch, shape[-2], shape[-1], x_batch, xs[-2],
            q.data_ptr(), q_batch, qs[-2], *rest, raw_stream(device),
        )  # fmt: skip
    else:
        entry(
            x.data_ptr(), batch, shape[-2], shape[-1], x_batch, xs[-2], q.data_ptr(), q_batch, qs[-2], *rest,
            raw_stream(device),
        )  # fmt: skip
    return None


def set_pdl(enabled: bool) -> bool:
    """Turn programmatic dependent launch (PDL) on or off for every later fp8quant launch, in
    every thread; returns the previous setting.

    With PDL on (the default) a kernel may start while the previous kernel in its stream is
    finishing, and waits for that kernel's writes before it touches memory. Off, kernels launch
    plainly one after the other: a switch for bisecting a corruption. Results are the same either
    way. ``FP8QUANT_PDL=0`` in the environment, set before fp8quant is imported, starts with it off.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    return extension().set_pdl(enabled)


def pdl_enabled() -> bool:
    """Whether fp8quant's kernels launch with programmatic dependent launch (see :func:`set_pdl`)."""
    return extension().pdl_enabled()
