"""Check what a built fp8quant wheel holds and links against (CI, no GPU needed).

    python tests/tools/inspect_wheel.py dist/fp8quant-*.whl

- one copy of libfp8quant.so, beside the extension, and no symbolic links or grafted
  libraries (no ``fp8quant.libs/``);
- the C headers and the CMake package (fp8quantConfig.cmake, its version file and targets);
- every ELF file needs only glibc, libstdc++/libgcc and (the extension) libfp8quant, an allowlist
  that keeps the CUDA runtime, libtorch and libc10 out of DT_NEEDED; the extension finds
  libfp8quant through $ORIGIN;
- and it prints, for every ELF file, the highest GLIBC_, GLIBCXX_ and CXXABI_ symbol versions it
  needs: the glibc and libstdc++ it can load with, so a change that raises that floor shows.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import zipfile

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

SYSTEM = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "ld-linux-x86-64.so.2",
}
REQUIRED = [
    "fp8quant/include/fp8quant/fp8quant.h",
    "fp8quant/include/fp8quant/common.h",
    "fp8quant/include/fp8quant/quant.h",
    "fp8quant/include/fp8quant/fp8quant.hpp",
    "fp8quant/lib/cmake/fp8quant/fp8quantConfig.cmake",
    "fp8quant/lib/cmake/fp8quant/fp8quantConfigVersion.cmake",
    "fp8quant/lib/cmake/fp8quant/fp8quantTargets.cmake",
]


def dynamic_tags(data: bytes) -> tuple[list[str], list[str]]:
    """DT_NEEDED and DT_RUNPATH/DT_RPATH entries of an ELF file."""
    needed, runpath = [], []
    for section in ELFFile(io.BytesIO(data)).iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    needed.append(tag.needed)
                elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                    runpath.append(getattr(tag, "runpath", None) or tag.rpath)
    return needed, runpath


def version_floors(data: bytes) -> dict[str, str]:
    """The highest version an ELF file needs of each of GLIBC_, GLIBCXX_ and CXXABI_
    (``{"GLIBC": "2.34", ...}``), from its version-needed section."""
    best: dict[str, tuple[int, ...]] = {}
    for section in ELFFile(io.BytesIO(data)).iter_sections():
        if not isinstance(section, GNUVerNeedSection):
            continue
        for _, auxiliaries in section.iter_versions():
            for aux in auxiliaries:
                prefix, _, number = aux.name.partition("_")
                if prefix in ("GLIBC", "GLIBCXX", "CXXABI") and number[:1].isdigit():
                    version = tuple(int(part) for part in number.split(".") if part.isdigit())
                    best[prefix] = max(best.get(prefix, ()), version)
    return {prefix: ".".join(map(str, version)) for prefix, version in sorted(best.items())}


def check(path: str) -> list[str]:
    problems = []
    with zipfile.ZipFile(path) as wheel:
        infos = wheel.infolist()
        names = [info.filename for info in infos]
        for info in infos:
            if stat.S_ISLNK(info.external_attr >> 16):
                problems.append(f"symbolic link in the wheel: {info.filename}")
        libs = [n for n in names if n.rsplit("/", 1)[-1].startswith("libfp8quant")]
        if libs != ["fp8quant/libfp8quant.so"]:
            problems.append(f"expected exactly fp8quant/libfp8quant.so, found {libs}")
        grafted = [n for n in names if ".libs/" in n]
        if grafted:
            problems.append(f"libraries grafted into the wheel: {grafted}")
        problems += [f"missing {n}" for n in REQUIRED if n not in names]
        extensions = [n for n in names if n.startswith("fp8quant/_C.") and n.endswith(".so")]
        if len(extensions) != 1:
            problems.append(f"expected one extension fp8quant/_C*.so, found {extensions}")
        for name in names:
            data = wheel.read(name)
            if not data.startswith(b"\x7fELF"):
                continue
            needed, runpath = dynamic_tags(data)
            print(f"{name}: needs {', '.join(needed)}" + (f"; runpath {':'.join(runpath)}" if runpath else ""))
            floors = version_floors(data)
            print(f"{name}: highest symbol versions: " + ", ".join(f"{k}_{v}" for k, v in floors.items()))
            allowed = SYSTEM | ({"libfp8quant.so"} if name in extensions else set())
            for lib in needed:
                if lib not in allowed:
                    problems.append(f"{name} needs {lib}")
            if name in extensions and runpath != ["$ORIGIN"]:
                problems.append(f"{name} must find libfp8quant through RUNPATH $ORIGIN, has {runpath}")
    return problems


def main(paths: list[str]) -> int:
    failed = False
    for path in paths:
        print(f"==> {path}")
        if not os.path.isfile(path):
            print(f"FAIL: no such wheel: {path}")
            failed = True
            continue
        problems = check(path)
        for problem in problems:
            print(f"FAIL: {problem}")
        print("ok" if not problems else f"{len(problems)} problem(s)")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
