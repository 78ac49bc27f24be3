"""Run the C++ consumer (tests/consumer) and check it against the Python path.

    python tests/consumer/check_consumer.py build/consumer/fp8quant_consumer

With a supported GPU (compute capability 9.0 or 10.0): for each scale format and a few M, the
consumer's q and whole scale buffer must be bit-identical to ``fp8quant.per_token_group_quant``
on the same input. Without a GPU the consumer must exit with FP8QUANT_ERROR_NO_DEVICE (2), on
another GPU with FP8QUANT_ERROR_UNSUPPORTED_DEVICE (3), and say so, not crash.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import fp8quant
from fp8quant.bench.quant import format_name

NO_DEVICE, UNSUPPORTED_DEVICE = 2, 3
K = 7168
CASES = [(m, layout, ue8m0) for m in (1, 5, 129) for layout, ue8m0 in fp8quant.SCALE_FORMATS]


def run(binary: str, m: int, layout: str, ue8m0: bool, x: torch.Tensor, tmp: Path) -> subprocess.CompletedProcess:
    x_file, q_file, s_file = tmp / "x.bin", tmp / "q.bin", tmp / "scale.bin"
    x_file.write_bytes(x.view(torch.uint16).numpy().tobytes())
    cmd = [binary, str(m), str(K), layout, str(int(ue8m0)), str(x_file), str(q_file), str(s_file)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def main(binary: str) -> int:
    if not torch.cuda.is_available():
        expected = (NO_DEVICE, "FP8QUANT_ERROR_NO_DEVICE")
    elif torch.cuda.get_device_capability() not in ((9, 0), (10, 0)):
        expected = (UNSUPPORTED_DEVICE, "FP8QUANT_ERROR_UNSUPPORTED_DEVICE")
    else:
        expected = None
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if expected is not None:
            status, name = expected
            x = torch.randn(4, K, dtype=torch.bfloat16)
            done = run(binary, 4, "mn_tma", False, x, tmp)
            print(done.stdout + done.stderr, end="")
            if done.returncode != status or name not in done.stderr:
                hint = " (torch sees no CUDA device: is it a CPU build?)" if done.returncode == 0 else ""
                print(f"FAIL: expected exit status {status} and {name}, got {done.returncode}{hint}")
                return 1
            print(f"OK: no supported GPU here, and the consumer reported {name}")
            return 0

        generator = torch.Generator().manual_seed(0)
        failures = 0
        for m, layout, ue8m0 in CASES:
            x = torch.randn(m, K, generator=generator).mul_(4).to(torch.bfloat16)
            done = run(binary, m, layout, ue8m0, x, tmp)
            if done.returncode != 0:
                print(f"FAIL {m=} {layout=} {ue8m0=}: exit {done.returncode}: {done.stderr.strip()}")
                failures += 1
                continue
            q, scale = fp8quant.per_token_group_quant(x.cuda(), 128, scale_layout=layout, ue8m0=ue8m0)
            torch.cuda.synchronize()
            q_bytes = q.view(torch.uint8).cpu().numpy().tobytes()
            # the whole padded buffer behind the scale view, as the consumer wrote it
            buffer = torch.empty(0, dtype=torch.uint8, device=scale.device).set_(scale.untyped_storage())
            s_bytes = buffer.cpu().numpy().tobytes()
            same_q = (tmp / "q.bin").read_bytes() == q_bytes
            same_s = (tmp / "scale.bin").read_bytes() == s_bytes
            print(
                f"{'ok  ' if same_q and same_s else 'FAIL'} M={m:<4} {format_name(layout, ue8m0):<14}"
                f" q {len(q_bytes)} bytes {'identical' if same_q else 'DIFFER'},"
                f" scale buffer {len(s_bytes)} bytes {'identical' if same_s else 'DIFFER'}"
            )
            failures += not (same_q and same_s)
        print(f"{len(CASES) - failures}/{len(CASES)} cases bit-identical between the C++ consumer and Python")
        return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
