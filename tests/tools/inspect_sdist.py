"""Check what fp8quant's sdist holds (CI, no GPU needed): everything a build from source and the
tests need, and nothing else (no build trees, wheels, compiled objects, caches or CI files).

    python tests/tools/inspect_sdist.py dist/fp8quant-*.tar.gz
"""

from __future__ import annotations

import sys
import tarfile

REQUIRED = [
    "pyproject.toml", "CMakeLists.txt", "README.md", "cmake/fp8quantConfig.cmake.in",
    "include/fp8quant/fp8quant.h", "include/fp8quant/norm.h", "src/api/quant.cpp", "src/common/math.cuh",
    "src/kernels/per_token_group_quant.cuh", "src/impls/sm90_per_token_group_quant.cu",
    "src/impls/sm100_per_token_group_quant.cu", "python/fp8quant/__init__.py", "python/fp8quant/_C.cpp",
    "tests/python/conftest.py", "tests/cpp/CMakeLists.txt", "tests/consumer/CMakeLists.txt",
]  # fmt: skip
FORBIDDEN_DIRS = ("build/", "dist/", "wheelhouse/", ".venv/", ".gpu/", ".github/", ".ci/", "__pycache__/")
FORBIDDEN_SUFFIXES = (".whl", ".so", ".o", ".pyc", ".a")


def check(path: str) -> list[str]:
    with tarfile.open(path) as sdist:
        names = [m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name and m.isfile()]
    problems = [f"missing {n}" for n in REQUIRED if n not in names]
    for name in names:
        if any(f"/{d}" in f"/{name}" for d in FORBIDDEN_DIRS) or name.endswith(FORBIDDEN_SUFFIXES):
            problems.append(f"does not belong in the sdist: {name}")
    print(f"{path}: {len(names)} files")
    return problems


def main(paths: list[str]) -> int:
    failed = False
    for path in paths:
        problems = check(path)
        for problem in problems:
            print(f"FAIL: {problem}")
        failed |= bool(problems)
    print("ok" if not failed else "sdist check failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
