"""The server's own directories under the temporary directory: `container-<master pid>` (0700) holds
the channel's socket and, in `worker-<pid>`, each model process's scratch (archives it extracted, the
models a load request wrote). A model process may end any way (SIGKILL, the OOM killer, a retirement),
so its master removes its scratch when it exits, the whole directory when the server stops, and at start
the directories that servers killed outright left behind."""

import contextlib
import fcntl
import os
import tempfile

PREFIX = "container-"
LOCK = "lock"  # held by the server that owns the directory (claim)


def server(master_pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"{PREFIX}{master_pid}")


def scratch(master_pid: int, worker_pid: int) -> str:
    return os.path.join(server(master_pid), f"worker-{worker_pid}")


def make_private(directory: str) -> str:
    """`directory`, made if need be, and refused unless it is this user's alone: it is where the
    channel's socket and the models' files are."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory, follow_symlinks=False)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{directory} is not this user's private directory; refusing to serve from there")
    return directory


def claim(master_pid: int) -> int:
    """Make the server's directory and lock it for as long as the returned descriptor (and any copy a
    fork made) is open: a lock is what tells a live server's directory from a dead one's, across pid
    namespaces that share the directory, and whatever pid took a dead server's."""
    fd = os.open(os.path.join(make_private(server(master_pid)), LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def stale_servers() -> list[int]:
    """The master pids of this user's server directories that no live server holds."""
    stale = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            pid = entry.name.removeprefix(PREFIX)
            if entry.name.startswith(PREFIX) and pid.isdigit() and entry.is_dir(follow_symlinks=False) \
                    and entry.stat(follow_symlinks=False).st_uid == os.getuid() and not _held(entry.path):
                stale.append(int(pid))
    return stale


def _held(directory: str) -> bool:
    try:
        fd = os.open(os.path.join(directory, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # no lock yet: a server between making its directory and locking it
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
