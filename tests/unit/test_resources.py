"""How the server's processes keep the C heap they free (resources.keep_freed_heap); the page faults it
saves are measured on a real server (integration/test_memory.py)."""

import ctypes.util

import pytest

from container import resources

GLIBC = ctypes.util.find_library("c") == "libc.so.6"


@pytest.mark.parametrize("operator", [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_MMAP_MAX_": "0"},
                                      {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}])
def test_what_an_operator_set_for_malloc_stands(operator):
    environ = dict(operator)
    assert resources.keep_freed_heap(environ) is False
    assert environ == operator


def test_the_thresholds_reach_the_processes_the_server_starts():
    environ = {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096"}  # not malloc's: no say in it
    assert resources.keep_freed_heap(environ) is GLIBC
    if GLIBC:
        assert environ["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20)
        assert environ["MALLOC_TRIM_THRESHOLD_"] == str(64 << 20)
