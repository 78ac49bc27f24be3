"""The emulated chunks' bytes (nvfp4_chunks.cpp with EMU_DUMP=DIR) against
fp8quant.reference.nvfp4_quant on the CPU, batch by batch: q equal, scale bytes equal except
NaN bytes' sign bit, which docs/contract.md leaves unspecified (an infinite or NaN encode scale).

    python tests/emulation/compare_reference.py DIR
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import torch

from fp8quant import reference


def check(path: pathlib.Path) -> tuple[int, int]:
    """(batches, mismatching batches) of one dumped launch."""
    raw = path.read_bytes()
    size, is_half, swizzled, batch, m, k, pad, n_scales = (int(v) for v in np.frombuffer(raw[:32], np.int32))
    at = 32
    scales = torch.from_numpy(np.frombuffer(raw[at : at + 4 * n_scales], np.float32).copy())
    at += 4 * n_scales
    x_row, q_row = k + pad, k // 2 + pad
    x_batch, q_batch = m * x_row + 8 * pad, m * q_row + 8 * pad
    n = (batch - 1) * x_batch + (m - 1) * x_row + k  # the buffers as sized: exactly
    dtype = torch.float32 if size == 4 else torch.float16 if is_half else torch.bfloat16
    x = torch.from_numpy(np.frombuffer(raw[at : at + size * n], np.int32 if size == 4 else np.int16).copy()).view(dtype)
    at += size * n
    q_n = (batch - 1) * q_batch + (m - 1) * q_row + k // 2
    q = torch.from_numpy(np.frombuffer(raw[at : at + q_n], np.uint8).copy())
    at += q_n
    rows = -(-m // 128) * 128 if swizzled else m
    slots = -(-(k // 16) // 4) * 4 if swizzled else k // 16
    s = np.frombuffer(raw[at : at + batch * rows * slots], np.uint8)
    layout = "swizzled" if swizzled else "row"
    bad = 0
    for b in range(batch):
        xb = x.as_strided((m, k), (x_row, 1), b * x_batch)
        ref_q, ref_s, _ = reference.nvfp4_quant(xb, scales[b if n_scales > 1 else 0], scale_layout=layout)
        qb = q.as_strided((m, k // 2), (q_row, 1), b * q_batch)
        sb = torch.from_numpy(s[b * rows * slots : (b + 1) * rows * slots].copy())
        ref_sb = ref_s.view(torch.uint8).flatten()
        nan = ((sb & 0x7F) == 0x7F) & ((ref_sb & 0x7F) == 0x7F)
        if not (torch.equal(qb, ref_q) and torch.equal(sb[~nan], ref_sb[~nan])):
            bad += 1
            print(f"MISMATCH {path.name} batch {b}: {dtype} {layout} m={m} k={k}")
    return batch, bad


def main() -> int:
    batches = bad = 0
    for path in sorted(pathlib.Path(sys.argv[1]).glob("case_*.bin"), key=lambda p: int(p.stem[5:])):
        n, wrong = check(path)
        batches, bad = batches + n, bad + wrong
    print(f"{batches} batches against the reference: {bad} mismatched")
    return int(bad != 0 or batches == 0)


if __name__ == "__main__":
    sys.exit(main())
