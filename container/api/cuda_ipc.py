"""CUDA IPC memory through the CUDA runtime library that torch already loaded: a client's
`cudaIpcMemHandle_t` opened on its device, and copies between that memory and the host."""

import ctypes

from container.errors import InvalidRequest

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
_LAZY_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess
_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2  # cudaMemcpyKind
_SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


class CudaRuntime:
    def __init__(self):
        self._lib = _load()
        self._lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _Handle, ctypes.c_uint]
        self._lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        self._lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._lib.cudaSetDevice.argtypes = [ctypes.c_int]
        self._lib.cudaGetErrorString.restype = ctypes.c_char_p

    def open(self, handle: bytes, device: int) -> int:
        """The device address a client's IPC handle stands for, in this process."""
        pointer = ctypes.c_void_p()
        self._call("cudaSetDevice", device)
        self._call("cudaIpcOpenMemHandle", ctypes.byref(pointer), _Handle.from_buffer_copy(handle), _LAZY_PEER_ACCESS)
        return pointer.value

    def allocation_bytes(self, address: int) -> int:
        """Bytes from `address` to the end of the allocation that holds it (the driver's own count): what
        a client's `byte_size` may claim, as copies are not bounds-checked on the device."""
        driver = self._driver = getattr(self, "_driver", None) or ctypes.CDLL("libcuda.so.1")
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        code = driver.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(address))
        if code:
            raise InvalidRequest(f"cuMemGetAddressRange failed on the opened handle (CUDA driver error {code})")
        return base.value + size.value - address

    def close(self, address: int, device: int) -> None:
        self._call("cudaSetDevice", device)
        self._call("cudaIpcCloseMemHandle", address)

    def read(self, address: int, size: int, device: int) -> bytes:
        buffer = ctypes.create_string_buffer(size)
        self._call("cudaSetDevice", device)
        self._call("cudaMemcpy", buffer, address, size, _DEVICE_TO_HOST)
        return buffer.raw

    def write(self, address: int, data: bytes | memoryview, device: int) -> None:
        self._call("cudaSetDevice", device)
        source = data if isinstance(data, bytes) else bytes(data)  # ctypes passes bytes as a pointer, not a view
        self._call("cudaMemcpy", address, source, len(source), _HOST_TO_DEVICE)

    def _call(self, function: str, *args) -> None:
        code = getattr(self._lib, function)(*args)
        if code:
            raise InvalidRequest(f"{function} failed: {self._lib.cudaGetErrorString(code).decode()} (CUDA error {code})")


def _load() -> ctypes.CDLL:
    for soname in _SONAMES:  # torch's CUDA build has loaded one of them; dlopen finds it by name
        try:
            return ctypes.CDLL(soname)
        except OSError:
            continue
    raise InvalidRequest("CUDA shared memory needs the CUDA runtime library (libcudart), which cannot be loaded here")
