"""The server's own directories under the temporary directory: `container-<master pid>` (0700) holds
the channel's socket and, in `worker-<pid>`, each model process's scratch (archives it extracted, the
models a load request wrote). A model process may end any way (SIGKILL, the OOM killer, a retirement),
so its master removes its scratch when it exits, the whole directory when the server stops, and at start
the directories that servers killed outright left behind."""

import contextlib
import os
import tempfile

from container import dirlock

PREFIX = "container-"


def server(master_pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"{PREFIX}{master_pid}")


def scratch(master_pid: int, worker_pid: int) -> str:
    return os.path.join(server(master_pid), f"worker-{worker_pid}")


def make_private(directory: str) -> str:
    """`directory`, made if need be, and refused unless it is this user's alone: it is where the
    channel's socket and the models' files are."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    _check_private(directory)
    return directory


def claim(master_pid: int) -> int:
    """Make the server's directory, held (dirlock.py) for as long as the returned descriptor and the
    worker's copy of it are open. It appears held: made under another name, held, then renamed, so a
    server starting beside this one never takes it for a dead one's."""
    directory = server(master_pid)
    making = tempfile.mkdtemp(prefix=f".{PREFIX}{master_pid}-")
    fd = dirlock.hold(making)
    try:
        os.rename(making, directory)
    except OSError:
        os.close(fd)
        os.rmdir(making)
        _check_private(directory)
        raise PermissionError(f"{directory} is another running server's; refusing to serve there") from None
    return fd


def _check_private(directory: str) -> None:
    info = os.stat(directory, follow_symlinks=False)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{directory} is not this user's private directory; refusing to serve from there")


def stale_servers() -> list[int]:
    """The master pids of this user's server directories that no live server holds."""
    stale = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            pid = entry.name.removeprefix(PREFIX)
            if entry.name.startswith(PREFIX) and pid.isdigit() and entry.is_dir(follow_symlinks=False) \
                    and entry.stat(follow_symlinks=False).st_uid == os.getuid() and not dirlock.held(entry.path):
                stale.append(int(pid))
    return stale
