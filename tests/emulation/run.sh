#!/usr/bin/env bash
# Emulate kernels on the host, no GPU needed: NVFP4's chunks (nvfp4_chunks.cpp) and the
# block-scaled masked SiLU's walk (silu_walk.cpp). Copies src/ and include/ to a scratch directory
# with the PTX statements that produce nothing (PDL's waits, prefetches, a compiler pin) turned
# into no-ops, and the approximate ex2 and rcp into their exact values (shim.hpp; any other inline
# PTX on an emulated path fails to assemble), builds each with g++ (C++20, AddressSanitizer and UBSan) against the CUDA
# toolkit's headers, and runs them. With --reference, also checks the chunks' bytes against
# fp8quant.reference (compare_reference.py; PYTHON names an interpreter with fp8quant and torch,
# default python). Takes a few minutes.
#   tests/emulation/run.sh [--reference]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cuda="${CUDA_HOME:-/usr/local/cuda}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$root/src" "$root/include" "$work/"
grep -rlE 'asm volatile\("(griddepcontrol|prefetch)' "$work/src" |
  xargs sed -i -E 's/asm volatile\(("(griddepcontrol|prefetch))/EMU_ASM(\1/g'
sed -i -E -e 's/asm\("ex2\.approx\.ftz\.f32 %0, %1;" : "=f"\(y\) : "f"\((.*)\)\);$/y = emu_ex2_approx(\1);/' \
  -e 's/asm\("rcp\.approx\.ftz\.f32 %0, %1;" : "=f"\(r\) : "f"\(s\)\);$/r = emu_rcp_approx(s);/' "$work/src/common/math.cuh"
for stub in emu_ex2_approx emu_rcp_approx; do
  grep -q $stub "$work/src/common/math.cuh" || { echo "run.sh: the PTX $stub replaces was not found" >&2; exit 1; }
done
sed -i -E 's/^( *)asm\("" : [^;]*;/\1\/\/ (a compiler pin: none on the host)/' "$work/src/kernels/per_token_group_quant.cuh"
for program in nvfp4_chunks silu_walk; do
  g++ -std=c++20 -O1 -g -ffp-contract=off -fsanitize=address,undefined -fno-sanitize-recover=all -w \
    -I"$work/src" -I"$work/include" -I"$cuda/include" -include "$here/shim.hpp" \
    -o "$work/$program" "$here/$program.cpp" -lpthread
done
"$work/silu_walk"
if [[ "${1:-}" == "--reference" ]]; then
  mkdir "$work/dump"
  EMU_DUMP="$work/dump" "$work/nvfp4_chunks"
  "${PYTHON:-python}" "$here/compare_reference.py" "$work/dump"
else
  "$work/nvfp4_chunks"
fi
