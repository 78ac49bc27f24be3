#!/usr/bin/env bash
# Set up .venv with fp8quant, then run the C++ tests (ctest) and the Python tests (pytest)
# against the installed package. GPU tests run where a compute capability 9.0 or 10.x GPU is present and are
# skipped elsewhere.
set -euo pipefail
# The install's CMake build (scikit-build-core's build-dir, build/{wheel_tag}) builds the C++
# tests too, and ctest runs in that tree: the library is built once. The option stays in that
# tree's CMake cache, so later installs from this checkout (run.sh) keep the tests up to date.
export SKBUILD_CMAKE_DEFINE="FP8QUANT_BUILD_TESTS=ON${SKBUILD_CMAKE_DEFINE:+;$SKBUILD_CMAKE_DEFINE}"
# Show the build instead of minutes of silence (as run.sh does)
export PIP_VERBOSE=${PIP_VERBOSE:-2}
started=$(mktemp)
trap 'rm -f "$started"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

echo "==> C++ tests"
# The install's build tree: build/ and the wheel tag the install recorded; used only if this
# install ran there (its install manifest is newer than this script's start), else (another
# build-dir configured) the tests get a build of their own
tree=build/$(python - <<'PY'
from importlib.metadata import distribution

tags = [line.split(":", 1)[1].strip() for line in distribution("fp8quant").read_text("WHEEL").splitlines()
        if line.startswith("Tag:")]
print(tags[0] if len(tags) == 1 else "")
PY
)
if [ ! -f "$tree/CTestTestfile.cmake" ] || [ ! "$tree/install_manifest.txt" -nt "$started" ]; then
  echo "the install did not build the C++ tests in $tree: building them in build/test"
  cmake -S . -B build/test -G Ninja -DFP8QUANT_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build/test
  tree=build/test
fi
ctest --test-dir "$tree" --output-on-failure

echo "==> Python tests"
# The installed package is imported (python/ is not on sys.path from the repository root).
python -m pytest tests/python "$@"
