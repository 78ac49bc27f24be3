#!/usr/bin/env bash
# Prove the sdist on a machine without a GPU (CI runs this after check_wheels.sh): build it with
# `python -m build --sdist`, check its contents (tests/tools/inspect_sdist.py), install it into a
# fresh virtual environment the way users without a matching wheel do,
# `pip install --no-binary fp8quant <sdist>` (an isolated build with the local CUDA toolkit),
# and run the CPU tests from the unpacked sdist against that installed package. Everything goes to
# build/sdist.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
out=$repo/build/sdist

. scripts/activate.sh

rm -rf "$out"
mkdir -p "$out"
echo "==> sdist"
python -m pip install -q --disable-pip-version-check "build>=1.2"
python -m build --sdist --outdir "$out/dist" .
sdist=$(ls "$out"/dist/fp8quant-*.tar.gz)
python tests/tools/inspect_sdist.py "$sdist"

echo "==> pip install --no-binary fp8quant, in a fresh virtual environment"
python -m venv "$out/venv"
"$out/venv/bin/python" -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}" numpy \
  "pytest>=8" "hypothesis>=6"
"$out/venv/bin/python" -m pip install -q --disable-pip-version-check --no-binary fp8quant "$sdist"
installed=$("$out/venv/bin/python" -c 'import fp8quant, pathlib; print(pathlib.Path(fp8quant.__file__).parent)')
case $installed in
  "$out/venv/"*) echo "fp8quant imported from $installed" ;;
  *) echo "FAIL: fp8quant imported from $installed, not the fresh environment"; exit 1 ;;
esac
"$out/venv/bin/python" -m fp8quant --version

echo "==> the CPU tests of the unpacked sdist against it"
tar -xzf "$sdist" -C "$out"
src=$(ls -d "$out"/fp8quant-*/)
(cd "$out" && "$out/venv/bin/python" -m pytest "$src/tests/python" -q -p no:cacheprovider)
echo "==> sdist: all checks passed ($(basename "$sdist"))"
