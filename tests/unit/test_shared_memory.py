"""Client shared memory regions, which requests read and write on native threads (the thread pool decodes
and encodes them) while the loop registers and unregisters them: real files and real descriptors."""

import os

import pytest

from container.api.shared_memory import SharedMemory
from container.errors import RegionNotFound

SIZE = 4096


@pytest.fixture
def objects(tmp_path):
    """Two objects, each one byte repeated: a read of either must show its own byte, and nothing else."""
    for name, byte in (("mine", b"M"), ("theirs", b"T")):
        (tmp_path / name).write_bytes(byte * SIZE)
    return tmp_path


def test_a_region_unregistered_while_a_request_uses_it_stays_open_until_that_use_ends(objects):
    """An unregister closed the descriptor under a read on another thread: the read failed with EBADF (a
    500, found by a hunt of 8 clients registering, unregistering and inferring at once), or read the object
    a new registration had been given that descriptor's number: another client's data."""
    memory = SharedMemory(root=objects)
    memory.register_system("mine", "/mine", 0, SIZE)
    with memory.held("mine", 0, SIZE) as region:  # what a read or a write holds, on its thread
        memory.unregister("system", "mine")
        memory.register_system("theirs", "/theirs", 0, SIZE)  # would take the number a close freed
        assert region.read(0, SIZE) == b"M" * SIZE
        with pytest.raises(RegionNotFound, match="Unable to find shared memory region: 'mine'"):
            memory.read("mine", 0, SIZE)
        memory.register_system("mine", "/mine", 0, SIZE)  # the name is free again at once
    with pytest.raises(OSError):  # closed once its last use ended
        os.fstat(region.fd)
    assert memory.read("mine", 0, 1) == b"M" and memory.read("theirs", 0, 1) == b"T"
