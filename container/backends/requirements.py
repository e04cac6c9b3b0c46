"""A handler model's `code/requirements.txt`, installed with `pip --target` into a directory of its own
(never the server's environment), kept per distinct file so reloads and other models reuse it.

pip expands `${VARIABLES}` in requirements files and quotes what it reads, from `-r` files too, so its
output goes to the server's log and never into an answer: a failure names the file's own lines."""

import contextlib
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
_COMPLETE, _SIZE = ".complete", ".size"  # in an install: it is whole (its time: last used), and its bytes on disk
_in_use: list[int] = []  # the installs this process uses, shared for its life (dirlock.share)
# `python -c _DIES_WITH_PARENT <parent pid> ARGS…` runs `python ARGS…`, killed when the parent dies (a
# worker killed as its load timed out would leave pip running on, writing where nothing waits for it)
_DIES_WITH_PARENT = ("import os, sys\n"
                     "from container.resources import die_with_parent\n"
                     "die_with_parent()\n"
                     "if os.getppid() != int(sys.argv[1]): sys.exit('the worker that ran pip has ended')\n"
                     "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n")


def install(requirements: Path, cache_root: str, most_bytes: int) -> Path:
    """The directory holding the installed packages, in use (`dirlock.share`) for as long as this process
    lives; blocking (pip runs here, in the model's worker). A new install leaves the cache within
    `most_bytes`: the directories no worker uses leave, least recently used first."""
    text = requirements.read_bytes()
    key = hashlib.sha256(text + sys.version.encode()).hexdigest()[:24]
    cache, target = Path(cache_root), Path(cache_root) / key
    with _locked(cache):
        if _use(target):
            return target
        staging, held = _staging(cache, key)
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
        (packages / _SIZE).write_text(str(_disk_usage(packages)))
        (packages / _COMPLETE).touch()
        with _locked(cache):
            try:
                os.rename(packages, target)
            except OSError:  # another worker installed the same file meanwhile: use theirs
                if not (target / _COMPLETE).is_file():
                    raise
            _use(target)
            _evict(cache, most_bytes)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(held)
    return target


@contextlib.contextmanager
def _locked(cache_root: Path):
    """The cache to this process alone for a moment (a blocking lock, where `dirlock` holds for a process's
    life): what is used, made, swept or evicted is decided one process at a time."""
    cache_root.mkdir(parents=True, exist_ok=True)
    cache = os.open(cache_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(cache, fcntl.LOCK_EX)
        yield
    finally:
        os.close(cache)  # and its lock


def _use(target: Path) -> bool:
    """Share `target` for this process's life and mark it used now, if it is a complete install."""
    if not (target / _COMPLETE).is_file():
        return False
    _in_use.append(dirlock.share(str(target)))
    (target / _COMPLETE).touch()  # its time is the cache's order: least recently used first
    return True


def _evict(cache_root: Path, most_bytes: int) -> None:
    """Remove the installs no process uses, least recently used first, while the cache is over `most_bytes`.
    Each is renamed hidden before it is removed, so a removal cut short is swept as a staging directory."""
    installs = [entry for entry in cache_root.iterdir() if not entry.name.startswith(".") and (entry / _COMPLETE).is_file()]
    sizes = {entry: _recorded_size(entry) for entry in installs}
    total = sum(sizes.values())
    for entry in sorted(installs, key=lambda e: (e / _COMPLETE).stat().st_mtime):
        if total <= most_bytes:
            return
        fd = dirlock.take(str(entry))
        if fd is None:  # a worker uses it
            continue
        gone = cache_root / f".evicted-{entry.name}"
        shutil.rmtree(gone, ignore_errors=True)  # an eviction of the same install cut short, since the last sweep
        try:
            os.rename(entry, gone)
        finally:
            os.close(fd)
        shutil.rmtree(gone, ignore_errors=True)
        total -= sizes[entry]
        log.info("evicted installed requirements", extra={"fields": {"directory": entry.name, "bytes": sizes[entry]}})
    if total > most_bytes:
        log.warning("the requirements cache is over its size: every install in it is in use", extra={"fields": {
            "bytes": total, "most": most_bytes}})


def _recorded_size(entry: Path) -> int:
    try:
        return int((entry / _SIZE).read_text())
    except (OSError, ValueError):
        return _disk_usage(entry)


def _disk_usage(directory: Path) -> int:
    """The bytes its files take on disk."""
    return sum(path.lstat().st_blocks * 512 for path in directory.rglob("*"))


def _staging(cache_root: Path, key: str) -> tuple[Path, int]:
    """A new directory to install into, held (dirlock.py) while this process installs; the caller holds
    the cache's lock (`_locked`), so a staging directory is never swept before it is held. Those that no
    process holds are removed first: a worker killed while pip ran (its load timed out, the OOM killer)
    left its install behind, and each try of the same load would leave another."""
    for entry in os.scandir(cache_root):
        if entry.name.startswith(".") and entry.is_dir(follow_symlinks=False) and not dirlock.held(entry.path):
            shutil.rmtree(entry.path, ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root)
    return Path(staging), dirlock.hold(staging)


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
