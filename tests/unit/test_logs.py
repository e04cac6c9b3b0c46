"""Log lines in the model process come from its loop's greenlets and from native threads at once (a load
on the thread pool, an execution on an instance thread). A process patched as the model process is, so
that the locks are the ones it really meets."""

import subprocess
import sys

from tests.conftest import PROJECT

# Threads of the hub's pool log while a greenlet on the loop logs too; each round has a deadline, and the
# process says whether every round ended. With gevent's lock in the handler it hung in the first.
LOGGING_FROM_THREADS_AND_LOOP = """
from tests.model_process import patch_as_the_model_process
patch_as_the_model_process()
import logging, os, sys
import gevent
from container.logs import configure_logging

configure_logging("INFO")
log = logging.getLogger("test")

def from_a_thread(lines):
    for _ in range(lines):
        log.info("a line from a thread")

def from_the_loop():
    while True:
        log.info("a line from the loop")
        gevent.sleep(0)

gevent.spawn(from_the_loop)
pool = gevent.get_hub().threadpool
for _ in range(20):
    tasks = [pool.spawn(from_a_thread, 200) for _ in range(4)]
    if len(gevent.wait(tasks, timeout=30)) < len(tasks):
        print("a thread never finished its lines", file=sys.__stdout__, flush=True)
        os._exit(1)
print("every line written", file=sys.__stdout__, flush=True)
os._exit(0)
"""


def test_threads_and_the_loop_log_at_once_and_none_waits_for_ever():
    """A load logging from the thread pool while the loop logged requests hung the load path, and every
    request that logged after it (a chaos run's INFO access log)."""
    ran = subprocess.run([sys.executable, "-c", LOGGING_FROM_THREADS_AND_LOOP], cwd=PROJECT, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, timeout=600)
    assert ran.stdout.strip() == "every line written" and ran.returncode == 0
