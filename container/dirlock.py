"""A directory in use is locked (flock) by the process that uses it, for as long as that process (or a
fork of it) lives: what a killed process left is told from what a live one is using, across pid
namespaces that share the directory and whatever pid the dead one's went to. A directory several
processes use at once is shared by each (`share`), and only one that none uses can be taken (`take`)."""

import fcntl
import os


def hold(directory: str) -> int:
    """Lock `directory` for as long as the returned descriptor is open (and every copy of it a fork
    made: its close-on-exec flag keeps it from programs this process runs); raises OSError while
    another process holds or shares it."""
    return _lock(directory, fcntl.LOCK_EX)


def share(directory: str) -> int:
    """Hold `directory` in use beside any other process that does, as `hold` does; raises OSError
    while a process has taken it."""
    return _lock(directory, fcntl.LOCK_SH)


def take(directory: str) -> int | None:
    """Lock `directory` for this process alone, as `hold` does; None while any process holds or shares it."""
    try:
        return hold(directory)
    except BlockingIOError:
        return None


def held(directory: str) -> bool:
    """Whether a live process holds `directory` (False too when it is gone)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _lock(directory: str, mode: int) -> int:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd
