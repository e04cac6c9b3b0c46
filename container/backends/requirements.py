"""A handler model's `code/requirements.txt`, installed with `pip --target` into a directory of its own
(never the server's environment), kept per distinct file so reloads and other models reuse it.

pip expands `${VARIABLES}` in requirements files and quotes what it reads, from `-r` files too, so its
output goes to the server's log and never into an answer: a failure names the file's own lines."""

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from container import dirlock
from container.errors import InvalidModel

log = logging.getLogger(__name__)
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_CREDENTIALS = re.compile(r"//[^/@\s]*@")  # user:token@ in a url
# `python -c _DIES_WITH_PARENT <parent pid> ARGS…` runs `python ARGS…`, killed when the parent dies (a
# worker killed as its load timed out would leave pip running on, writing where nothing waits for it)
_DIES_WITH_PARENT = ("import os, sys\n"
                     "from container.resources import die_with_parent\n"
                     "die_with_parent()\n"
                     "if os.getppid() != int(sys.argv[1]): sys.exit('the worker that ran pip has ended')\n"
                     "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n")


def install(requirements: Path, cache_root: str) -> Path:
    """The directory holding the installed packages; blocking (pip runs here, in the model's worker)."""
    text = requirements.read_bytes()
    key = hashlib.sha256(text + sys.version.encode()).hexdigest()[:24]
    target = Path(cache_root) / key
    if (target / ".complete").is_file():
        return target
    staging, held = _staging(Path(cache_root), key)
    packages, scratch = staging / "packages", staging / "tmp"  # pip's own temporary files too: a killed pip leaves them
    try:
        packages.mkdir()
        scratch.mkdir()
        result = subprocess.run(
            [sys.executable, "-c", _DIES_WITH_PARENT, str(os.getpid()), "-m", "pip", "install", "--quiet", "--no-input",
             "--disable-pip-version-check", "--target", str(packages), "-r", str(requirements)],
            cwd=requirements.parent, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(scratch)},
        )
        if result.returncode != 0:
            output = (result.stderr + result.stdout).strip()
            log.warning("requirements.txt did not install", extra={"fields": {
                "requirements": str(requirements), "exit": result.returncode, "pip": output[-4000:]}})
            raise InvalidModel(failure_message(text.decode(errors="replace"), output, result.returncode, requirements.name))
        (packages / ".complete").touch()
        try:
            os.rename(packages, target)
        except OSError:  # another worker installed the same file meanwhile: use theirs
            if not (target / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(held)
    return target


def _staging(cache_root: Path, key: str) -> tuple[Path, int]:
    """A new directory to install into, held (dirlock.py) while this process installs. Those that no
    process holds are removed first: a worker killed while pip ran (its load timed out, the OOM
    killer) left its install behind, and each try of the same load would leave another. Making one and
    sweeping go one at a time (a lock on the cache), so a staging directory is never swept before it is
    held."""
    cache_root.mkdir(parents=True, exist_ok=True)
    cache = os.open(cache_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(cache, fcntl.LOCK_EX)
        for entry in os.scandir(cache_root):
            if entry.name.startswith(".") and entry.is_dir(follow_symlinks=False) and not dirlock.held(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)
        staging = tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root)
        return Path(staging), dirlock.hold(staging)
    finally:
        os.close(cache)  # and its lock


def failure_message(text: str, output: str, status: int, filename: str = "requirements.txt") -> str:
    """What a client is told: the lines of the file (as written, variables unexpanded, credentials in
    urls masked) that pip's output names, never pip's output itself."""
    named = [f"line {number}: {_CREDENTIALS.sub('//***@', line)!r}" for number, line in failing_lines(text, output, filename)]
    where = f"; pip failed on {', '.join(named[:3])}" if named else ""
    return (f"code/requirements.txt did not install (pip exited {status}){where}. pip's own output is in the "
            f"server's log")


def failing_lines(text: str, output: str, filename: str = "requirements.txt") -> list[tuple[int, str]]:
    """(number, line) of each requirement line pip's output names: by its number (`from line 2 of
    requirements.txt`, as pip says of a line it cannot parse), or by its requirement. Option lines
    (`-r`, `--index-url`, …) are never quoted: they may name files or carry credentials."""
    folded = output.lower()
    numbered = {int(n) for n in re.findall(rf"from line (\d+) of (?:\S*/)?{re.escape(filename)}\b", output)}
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        spec = line.split(" #")[0].strip()
        if not spec or spec.startswith(("#", "-")):
            continue
        token = spec.split(";")[0].split()[0]
        project = _PROJECT.match(os.path.basename(token))
        if number in numbered or token.lower() in folded or (
                project and re.search(rf"(?<![\w.-]){re.escape(project[0].lower())}(?![\w-])", folded)):
            found.append((number, spec))
    return found
