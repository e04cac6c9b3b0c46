"""The system shared memory extension: POSIX shared memory regions that clients register by key
(as `tritonclient.utils.shared_memory` creates them under /dev/shm), read for inputs and written for
outputs. Regions are read and written with pread/pwrite, never mapped: a client may truncate its
object at any time, and a mapped page past the new end would kill the server with SIGBUS. Each access
checks the object's current size, so truncation is a 400."""

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from flask import Blueprint, Flask, Response, request

from container import content
from container.errors import InvalidRequest, ServeError

SHM_ROOT = Path("/dev/shm")


class RegionNotFound(ServeError):
    status = 404


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SystemSharedMemory:
    def __init__(self, root: Path = SHM_ROOT):
        self._root = root
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key, offset, byte_size) -> None:
        if name in self._regions:
            raise InvalidRequest(f"shared memory region '{name}' is already registered; unregister it first")
        if (not isinstance(key, str) or not key.strip("/") or "/" in key.strip("/") or key.strip("/") in (".", "..")
                or "\0" in key or len(key) > 255):
            raise InvalidRequest(f"'key' must name a POSIX shared memory object such as '/my_region', got {key!r:.100}")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidRequest(f"'{field}' must be a non-negative whole number")
        try:  # O_NOFOLLOW: a symlink planted in /dev/shm must not lead the server's writes elsewhere
            fd = os.open(self._root / key.strip("/"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidRequest(f"cannot open shared memory object {key!r}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidRequest(f"{key!r} is not a shared memory object")
            if offset + byte_size > info.st_size or byte_size == 0:
                raise InvalidRequest(f"region [{offset}, {offset + byte_size}) does not fit the {info.st_size}-byte object {key!r}")
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = Region(name, key, offset, byte_size, fd)

    def unregister(self, name: str | None = None) -> None:
        """Unregister one region (or all, without a name); unknown names are not an error, as in Triton."""
        names = [name] if name is not None else list(self._regions)
        for region_name in names:
            region = self._regions.pop(region_name, None)
            if region is not None:
                os.close(region.fd)

    def status(self, name: str | None = None) -> list[dict]:
        if name is None:
            return [r.status() for r in self._regions.values()]
        return [self._region(name).status()]

    def read(self, name: str, offset: int, byte_size: int) -> bytes:
        region, start = self._checked(name, offset, byte_size)
        data = os.pread(region.fd, byte_size, start)
        if len(data) != byte_size:  # truncated between the check and the read
            raise self._truncated(region)
        return data

    def write(self, name: str, offset: int, byte_size: int, data: bytes) -> None:
        if len(data) > byte_size:
            raise InvalidRequest(f"the output needs {len(data)} bytes; shared memory region '{name}' offers {byte_size}")
        region, start = self._checked(name, offset, byte_size)
        os.pwrite(region.fd, data, start)

    def _region(self, name: str) -> Region:
        if name not in self._regions:
            raise RegionNotFound(f"shared memory region '{name}' is not registered")
        return self._regions[name]

    def _checked(self, name: str, offset: int, byte_size: int) -> tuple[Region, int]:
        """The region and the absolute position of `offset` in its object, once both the registered
        region and the object as it is now hold `byte_size` bytes there."""
        try:
            region = self._region(name)
        except RegionNotFound as exc:
            raise InvalidRequest(str(exc)) from None
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidRequest(
                f"[{offset}, {offset + byte_size}) lies outside shared memory region '{name}' of {region.byte_size} bytes"
            )
        start = region.offset + offset
        if start + byte_size > os.fstat(region.fd).st_size:
            raise self._truncated(region)
        return region, start

    @staticmethod
    def _truncated(region: Region) -> InvalidRequest:
        return InvalidRequest(f"shared memory object {region.key!r} of region '{region.name}' was truncated "
                              f"below the registered {region.offset + region.byte_size} bytes; register it again")


def register_shared_memory_endpoints(app: Flask, shared_memory: SystemSharedMemory) -> None:
    api = Blueprint("shared_memory", __name__)

    @api.get("/v2/systemsharedmemory/status")
    @api.get("/v2/systemsharedmemory/region/<name>/status")
    def status(name=None):
        return Response(content.encode_json(shared_memory.status(name)), 200, mimetype=content.JSON)

    @api.post("/v2/systemsharedmemory/region/<name>/register")
    def register(name):
        document = content.parse_object(request.get_data(), 'the body {"key": "...", "offset": 0, "byte_size": N}')
        shared_memory.register(name, document.get("key"), document.get("offset", 0), document.get("byte_size"))
        return Response(b"", 200)

    @api.post("/v2/systemsharedmemory/unregister")
    @api.post("/v2/systemsharedmemory/region/<name>/unregister")
    def unregister(name=None):
        shared_memory.unregister(name)
        return Response(b"", 200)

    app.register_blueprint(api)
