"""The shared memory extensions: client regions that infer requests name for their inputs and outputs.

System shared memory: POSIX objects that clients register by key (as `tritonclient.utils.shared_memory`
creates them under /dev/shm). They are read and written with pread/pwrite, never mapped: a client may
truncate its object at any time, and a mapped page past the new end would kill the server with SIGBUS.
Each access checks the object's current size, so truncation is a 400.

CUDA shared memory: device memory that clients export with `cudaIpcGetMemHandle`, opened here through
the CUDA runtime and copied to and from the host. Without a GPU, status lists nothing and registration
is a 400. Both kinds share one namespace of region names, as in Triton. `SERVE_ALLOW_CLIENT_SHM=false`
refuses every registration, as Triton does without `--allow-client-shm`."""

import base64
import binascii
import contextlib
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from container import content
from container.api.cuda_ipc import HANDLE_BYTES, CudaRuntime
from container.api.openapi import EMPTY, NUMBERS, V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.errors import InvalidRequest, RegionNotFound

SHM_ROOT = Path("/dev/shm")


@dataclass(eq=False)  # one registration is one region: compared and hashed by identity
class SystemRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, offset: int, byte_size: int) -> bytes:
        start = self._checked(offset, byte_size)
        data = os.pread(self.fd, byte_size, start)
        if len(data) != byte_size:  # truncated between the check and the read
            raise self._truncated()
        return data

    def write(self, offset: int, data: bytes | memoryview) -> None:
        os.pwrite(self.fd, data, self._checked(offset, len(data)))

    def close(self) -> None:
        os.close(self.fd)

    def _checked(self, offset: int, byte_size: int) -> int:
        """The absolute position of `offset` in the object, once the object as it is now holds
        `byte_size` bytes there."""
        start = self.offset + offset
        if start + byte_size > os.fstat(self.fd).st_size:
            raise self._truncated()
        return start

    def _truncated(self) -> InvalidRequest:
        return InvalidRequest(f"shared memory object {self.key!r} of region '{self.name}' was truncated "
                              f"below the registered {self.offset + self.byte_size} bytes; register it again")


@dataclass(eq=False)
class CudaRegion:
    name: str
    device_id: int
    byte_size: int
    address: int
    runtime: CudaRuntime

    def status(self) -> dict:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, offset: int, byte_size: int) -> bytes:
        return self.runtime.read(self.address + offset, byte_size, self.device_id)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        self.runtime.write(self.address + offset, data, self.device_id)

    def close(self) -> None:
        self.runtime.close(self.address, self.device_id)


_KINDS = {"system": SystemRegion, "cuda": CudaRegion}


class SharedMemory:
    def __init__(self, root: Path = SHM_ROOT, allowed: bool = True, gpus: int = 0, max_regions: int = 256):
        """`max_regions`: each region holds a descriptor (system) or a device mapping (CUDA) until unregistered."""
        self._root, self._allowed, self._gpus, self._max_regions = root, allowed, gpus, max_regions
        self._regions: dict[str, SystemRegion | CudaRegion] = {}
        self._cuda: CudaRuntime | None = None
        # Reads and writes run on native threads while the loop unregisters: a region in use is closed only
        # once its last use ends (its descriptor, closed under a read, failed it, or was reused by another
        # file meanwhile). Taken by both, so a native lock, held for no yield.
        self._lock = threading.Lock()
        self._uses: dict[SystemRegion | CudaRegion, int] = {}
        self._unregistered: set[SystemRegion | CudaRegion] = set()

    def register_system(self, name: str, key, offset, byte_size) -> None:
        self._check_new(name)
        if (not isinstance(key, str) or not key.strip("/") or "/" in key.strip("/") or key.strip("/") in (".", "..")
                or "\0" in key or len(key) > 255):
            raise InvalidRequest(f"'key' must name a POSIX shared memory object such as '/my_region', got {key!r:.100}")
        _check_sizes(offset=offset, byte_size=byte_size)
        try:  # O_NOFOLLOW: a symlink planted in /dev/shm must not lead the server's writes elsewhere
            fd = os.open(self._root / key.strip("/"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:  # Triton's words, then why
            raise InvalidRequest(f"Unable to open shared memory region: '{key}' ({exc.strerror})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidRequest(f"{key!r} is not a shared memory object")
            if offset + byte_size > info.st_size or byte_size == 0:  # Triton's words, then why
                raise InvalidRequest(f"failed to register shared memory region '{name}': invalid args ([{offset}, "
                                     f"{offset + byte_size}) does not fit the {info.st_size}-byte object '{key}')")
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = SystemRegion(name, key, offset, byte_size, fd)

    def register_cuda(self, name: str, raw_handle, device_id, byte_size) -> None:
        self._check_new(name)
        _check_sizes(device_id=device_id, byte_size=byte_size)
        if not self._gpus:
            raise InvalidRequest("CUDA shared memory needs a GPU, and this server has none; use system shared memory")
        if device_id >= self._gpus:
            raise InvalidRequest(f"device_id {device_id} is not a GPU of this server (it has {self._gpus})")
        b64 = raw_handle.get("b64") if isinstance(raw_handle, dict) else None
        try:
            handle = base64.b64decode(b64, validate=True) if isinstance(b64, str) else b""
        except binascii.Error:
            handle = b""
        if len(handle) != HANDLE_BYTES:
            raise InvalidRequest("'raw_handle' must be {\"b64\": ...} holding a base64 cudaIpcMemHandle_t")
        self._cuda = self._cuda or CudaRuntime()
        address = self._cuda.open(handle, device_id)
        try:
            held = self._cuda.allocation_bytes(address)
            if byte_size > held:
                raise InvalidRequest(f"'byte_size' {byte_size} is larger than the {held} bytes the handle's allocation holds")
        except BaseException:
            self._cuda.close(address, device_id)
            raise
        self._regions[name] = CudaRegion(name, device_id, byte_size, address, self._cuda)

    def unregister(self, kind: str, name: str | None = None) -> None:
        """Unregister one region of the kind (or all, without a name); unknown names are not an error, as in Triton."""
        self._check_allowed()
        for region_name in [name] if name is not None else list(self._regions):
            with self._lock:
                region = self._regions.get(region_name)
                if not isinstance(region, _KINDS[kind]):
                    continue
                del self._regions[region_name]
                in_use = region in self._uses
                if in_use:
                    self._unregistered.add(region)
            if not in_use:
                region.close()

    def status(self, kind: str, name: str | None = None) -> list[dict]:
        if name is None:
            return [r.status() for r in self._regions.values() if isinstance(r, _KINDS[kind])]
        region = self._regions.get(name)
        if region is None:  # Triton's words, here and below
            raise RegionNotFound(f"Unable to find {kind} shared memory region: '{name}'")
        if not isinstance(region, _KINDS[kind]):
            wanted, registered = ("CUDA", "system") if kind == "cuda" else ("system", "CUDA")
            raise RegionNotFound(f"The region named '{name}' is registered as {registered} shared memory, not "
                                 f"{wanted} shared memory")
        return [region.status()]

    def read(self, name: str, offset: int, byte_size: int) -> bytes:
        with self.held(name, offset, byte_size) as region:
            return region.read(offset, byte_size)

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview) -> None:
        if len(data) > byte_size:
            raise InvalidRequest(f"the output needs {len(data)} bytes; shared memory region '{name}' offers {byte_size}")
        with self.held(name, offset, byte_size) as region:
            region.write(offset, data)

    @contextlib.contextmanager
    def held(self, name: str, offset: int, byte_size: int):
        """The region, held open while the block uses it (a read or a write, on its thread), whatever unregisters
        it meanwhile."""
        with self._lock:
            region = self._region(name, offset, byte_size)
            self._uses[region] = self._uses.get(region, 0) + 1
        try:
            yield region
        finally:
            with self._lock:
                self._uses[region] -= 1
                last = not self._uses[region]
                if last:
                    del self._uses[region]
                close = last and region in self._unregistered
                if close:
                    self._unregistered.remove(region)
            if close:
                region.close()

    def _region(self, name: str, offset: int, byte_size: int):
        """The region, once its registered size holds `byte_size` bytes at `offset`."""
        region = self._regions.get(name)
        if region is None:  # Triton's words, here and below, then where
            raise RegionNotFound(f"Unable to find shared memory region: '{name}'")
        if not 0 <= offset < region.byte_size:
            raise InvalidRequest(f"Invalid offset for shared memory region: '{name}' (offset {offset} of its "
                                 f"{region.byte_size} bytes)")
        if not 0 <= byte_size <= region.byte_size - offset:
            raise InvalidRequest(f"Invalid offset + byte size for shared memory region: '{name}' "
                                 f"([{offset}, {offset + byte_size}) lies outside its {region.byte_size} bytes)")
        return region

    def _check_new(self, name: str) -> None:
        self._check_allowed()
        if name in self._regions:
            raise InvalidRequest(f"shared memory region '{name}' already in manager; unregister it first")  # Triton's words
        if len(self._regions) >= self._max_regions:
            raise InvalidRequest(f"{len(self._regions)} shared memory regions are registered, the most this server "
                                 f"holds (SERVE_MAX_SHM_REGIONS); unregister one first")

    def _check_allowed(self) -> None:
        if not self._allowed:
            raise InvalidRequest("Client shared memory is disabled. Start the server with SERVE_ALLOW_CLIENT_SHM=true to enable.")


def _check_sizes(**values) -> None:
    for field, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidRequest(f"'{field}' must be a non-negative whole number")


def shared_memory_routes(shared_memory: SharedMemory) -> list[Route]:
    def status(kind: str):
        def serve(request: Request) -> Response:
            return Response(content.encode_json(shared_memory.status(kind, request.params.get("name"))), content.JSON)
        return serve

    def unregister(kind: str):
        def serve(request: Request) -> Response:
            shared_memory.unregister(kind, request.params.get("name"))
            return Response()
        return serve

    def register_system(request: Request) -> Response:
        document = content.parse_object(request.body, 'the body {"key": "...", "offset": 0, "byte_size": N}')
        shared_memory.register_system(request.params["name"], document.get("key"), document.get("offset", 0),
                                      document.get("byte_size"))
        return Response()

    def register_cuda(request: Request) -> Response:
        document = content.parse_object(request.body, 'the body {"raw_handle": {"b64": "..."}, "device_id": 0, "byte_size": N}')
        shared_memory.register_cuda(request.params["name"], document.get("raw_handle"), document.get("device_id", 0),
                                    document.get("byte_size"))
        return Response()

    return [
        Route("GET", "/v2/systemsharedmemory/status", status("system"), "shared-memory", _STATUS_ALL),
        Route("GET", "/v2/systemsharedmemory/region/{name}/status", status("system"), "shared-memory", _STATUS),
        Route("POST", "/v2/systemsharedmemory/region/{name}/register", register_system, "shared-memory", _REGISTER_SYSTEM),
        Route("POST", "/v2/systemsharedmemory/region/{name}/unregister", unregister("system"), "shared-memory", _UNREGISTER),
        Route("POST", "/v2/systemsharedmemory/unregister", unregister("system"), "shared-memory", _UNREGISTER_ALL),
        Route("GET", "/v2/cudasharedmemory/status", status("cuda"), "shared-memory", _STATUS_ALL),
        Route("GET", "/v2/cudasharedmemory/region/{name}/status", status("cuda"), "shared-memory", _STATUS),
        Route("POST", "/v2/cudasharedmemory/region/{name}/register", register_cuda, "shared-memory", _REGISTER_CUDA),
        Route("POST", "/v2/cudasharedmemory/region/{name}/unregister", unregister("cuda"), "shared-memory", _UNREGISTER),
        Route("POST", "/v2/cudasharedmemory/unregister", unregister("cuda"), "shared-memory", _UNREGISTER_ALL),
    ]


# The OpenAPI operations of the routes above (api/openapi.py)
_STATUS_ALL = operation("every registered region", V2, json_content(NUMBERS), errors=())
_STATUS = operation("one registered region", V2, json_content(NUMBERS))
_REGISTER_SYSTEM = operation("register a POSIX shared memory object under /dev/shm", V2, EMPTY, json_content(object_schema({
    "key": {"type": "string"}, "offset": {"type": "integer", "minimum": 0}, "byte_size": {"type": "integer", "minimum": 0}},
    ["key", "byte_size"])), errors=(400,))
_REGISTER_CUDA = operation("register CUDA memory a client exported with cudaIpcGetMemHandle (400 without a GPU)", V2, EMPTY,
                           json_content(object_schema({
                               "raw_handle": object_schema({"b64": {"type": "string"}}, ["b64"]),
                               "device_id": {"type": "integer", "minimum": 0}, "byte_size": {"type": "integer", "minimum": 0}},
                               ["raw_handle", "byte_size"])), errors=(400,))
_UNREGISTER = operation("unregister one region", V2, EMPTY, errors=())
_UNREGISTER_ALL = operation("unregister every region", V2, EMPTY, errors=())
