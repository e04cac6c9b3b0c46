"""`python -m bench.perf_analyzer_install DIRECTORY`: perf_analyzer and the CUDA runtime it links, out of
the wheels `make bench-perf-analyzer` downloaded into DIRECTORY/downloads."""

import sys
import zipfile
from pathlib import Path

_MEMBERS = {"tritonclient-": ("tritonclient-2.41.0.data/data/bin/perf_analyzer", "perf_analyzer"),
            "nvidia_cuda_runtime_cu12-": ("nvidia/cuda_runtime/lib/libcudart.so.12", "lib/libcudart.so.12")}


def main(directory: Path) -> None:
    for wheel in sorted((directory / "downloads").glob("*.whl")):
        for prefix, (member, target) in _MEMBERS.items():
            if wheel.name.startswith(prefix):
                with zipfile.ZipFile(wheel) as archive:
                    (directory / target).write_bytes(archive.read(member))
                (directory / target).chmod(0o755)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
