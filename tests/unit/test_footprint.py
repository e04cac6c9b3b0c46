"""The activation peak counts the anonymous memory an execution takes, not the file pages it first reads."""

import mmap

import numpy as np

from container.backends import footprint

MIB = 1 << 20


def test_pages_of_a_file_read_in_an_execution_are_not_its_peak_and_its_allocations_are(tmp_path):
    """A first execution faults in the machine code of the paths it takes (~1.1 MiB of libtorch_cpu.so for
    a first TorchScript call): the process keeps those pages for every model, and the first model loaded
    was charged them (5.6 MB held for 4.2 MB of weights). A file's pages stand in for the code here."""
    code = tmp_path / "code.so"
    code.write_bytes(np.random.default_rng(0).bytes(16 * MIB))
    peak = {}
    with code.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        with footprint.execution_peak("cpu", peak):
            touched = sum(pages[offset] for offset in range(0, len(pages), mmap.PAGESIZE))
    assert touched > 0 and peak["cpu"] < 2 * MIB

    # Anonymous pages of its own, as an activation's: an allocator's may be pages it kept from an earlier
    # test (a thread's arena, whose free top malloc_trim leaves resident), which no peak sees again.
    with footprint.execution_peak("cpu", peak), mmap.mmap(-1, 16 * MIB) as activations:
        for offset in range(0, len(activations), mmap.PAGESIZE):
            activations[offset] = 1
    assert 15 * MIB <= peak["cpu"] < 20 * MIB  # less the code pages its own first steps faulted in
