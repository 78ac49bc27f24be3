"""Host time per eager call of the public op, in any fp8quant version (also those before
``python -m fp8quant bench --host-overhead`` existed), beside torch's cast of x to float8: the
before/after comparison in BENCHMARKS.md. Run it once per installed version:

    PYTHONPATH=/path/to/old python benchmarks/host_overhead_public.py
    python benchmarks/host_overhead_public.py

Same method as the bench's host mode: CALLS back-to-back calls then a synchronize, median of
ROUNDS round-robin rounds; M = 1, K = 7168, bf16, mn_tma.
"""

import statistics
import time

import torch

import fp8quant

CALLS, ROUNDS, WARMUP = 2000, 7, 200
M, K, LAYOUT = 1, 7168, "mn_tma"


def main() -> None:
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device="cuda")
    s = fp8quant.empty_scale(LAYOUT, M, K // 128, device="cuda")
    calls = {
        "x.to(float8_e4m3fn)": lambda: x.to(torch.float8_e4m3fn),
        "per_token_group_quant": lambda: fp8quant.per_token_group_quant(x, 128, scale_layout=LAYOUT),
        "per_token_group_quant(out=)": lambda: fp8quant.per_token_group_quant(x, 128, scale_layout=LAYOUT, out=(q, s)),
    }
    for call in calls.values():
        for _ in range(WARMUP):
            call()
    torch.cuda.synchronize()
    samples = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                call()
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - start) / CALLS * 1e6)
    base = statistics.median(samples["x.to(float8_e4m3fn)"])
    print(f"fp8quant from {fp8quant.__file__}, torch {torch.__version__}")
    for name, times in samples.items():
        us = statistics.median(times)
        print(f"  {name:<30} {us:7.1f} us  {us / base:5.2f}x the cast")


if __name__ == "__main__":
    main()
