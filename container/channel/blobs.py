"""Large binary values beside a channel frame: the sender writes each once into a file of its own under
/dev/shm (memory, not disk) and only the file's name crosses the socket; the receiver maps the file
(copy-on-write) and removes its name. A 6 MiB request then costs one copy on the way in instead of four
(msgpack, the socket both ways, msgpack again).

Names are `<prefix>-<pid>-<n>`, the prefix the channel's (`container-<master pid>`), so the receiver
takes only what a process of this server wrote: a name of another shape, a link, a file of another
user or of another size is refused. The master removes what a crashed process left (`remove_all`).
The model process writes for each front-end's connection apart (`<prefix>-<pid>-<connection>.<n>`),
and removes what a connection's front-end never took once it has hung up (`remove_untaken`); a
front-end removes what it wrote once its connection is lost, as what the model process had not read
by then nobody will."""

import itertools
import mmap
import os
import re
import stat
from pathlib import Path

THRESHOLD = 512 << 10  # smaller values stay in the frame: a file costs more than copying them
DIRECTORY = Path("/dev/shm")


class Large:
    """Binary data to send beside the frame (wire.pack asks `Blobs.put` for its name)."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def large(data):
    """`data` marked to travel beside the frame when it is large enough to gain by it."""
    return Large(data) if len(data) >= THRESHOLD else data


class Blobs:
    def __init__(self, prefix: str, directory: Path = DIRECTORY, connection: int | None = None):
        """`connection`: the one connection what this writes is for (the model process's side of it)."""
        self.prefix, self.directory = prefix, directory
        self._own = f"{prefix}-{os.getpid()}-" + ("" if connection is None else f"{connection}.")
        self._names = (f"{self._own}{n}" for n in itertools.count())
        self._shape = re.compile(rf"{re.escape(prefix)}-\d+-(?:\d+\.)?\d+")

    def remove_untaken(self) -> None:
        """What this process wrote for its connection and the reader never took: it has hung up, and takes
        nothing more (it takes each name as it reads the frame that holds it)."""
        for path in self.directory.glob(f"{self._own}*"):
            path.unlink(missing_ok=True)

    def put(self, data) -> str:
        name = next(self._names)
        fd = os.open(self.directory / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        try:
            view, written = memoryview(data).cast("B"), 0
            while written < len(view):
                written += os.write(fd, view[written:])
        except BaseException:
            os.unlink(self.directory / name)
            raise
        finally:
            os.close(fd)
        return name

    def take(self, name: str, size: int) -> memoryview:
        """The data behind `name`, mapped copy-on-write: an array over it is writable, so torch takes a
        large input as it is rather than copying it (as it must read-only memory), and a write stays in
        this process. The name is gone once this returns."""
        if not self._shape.fullmatch(name):
            raise ValueError(f"{name!r} is not a name this channel gives its data")
        path = self.directory / name
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.unlink(path)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size != size:
                raise ValueError(f"{name!r} is not the {size} bytes this channel wrote")
            return memoryview(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))
        finally:
            os.close(fd)

    def discard(self, name: str) -> None:
        """Data this process wrote that will not be sent after all."""
        (self.directory / name).unlink(missing_ok=True)

    def remove_all(self, sparing: int | None = None) -> None:
        """What processes of this server wrote and nobody took (one died in between); `sparing`: but
        what the process of that pid wrote."""
        for path in self.directory.glob(f"{self.prefix}-*"):
            if self._shape.fullmatch(path.name) and path.name.split("-")[-2] != str(sparing):
                path.unlink(missing_ok=True)
