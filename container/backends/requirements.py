"""A handler model's `code/requirements.txt`, installed with `pip --target` into a directory of its own
(never the server's environment), kept per distinct file so reloads and other models reuse it."""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from container.errors import InvalidModel

_PIP_TAIL = 1500  # characters of pip's output a 400 shows


def install(requirements: Path, cache_root: str) -> Path:
    """The directory holding the installed packages; blocking (pip runs here, in the model's worker)."""
    key = hashlib.sha256(requirements.read_bytes() + sys.version.encode()).hexdigest()[:24]
    target = Path(cache_root) / key
    if (target / ".complete").is_file():
        return target
    Path(cache_root).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check",
             "--target", str(staging), "-r", str(requirements)],
            cwd=requirements.parent, capture_output=True, text=True,
        )
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip()[-_PIP_TAIL:]
            raise InvalidModel(f"code/requirements.txt did not install (pip exited {result.returncode}): {message}")
        (staging / ".complete").touch()
        try:
            os.rename(staging, target)
        except OSError:  # another worker installed the same file meanwhile: use theirs
            if not (target / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
