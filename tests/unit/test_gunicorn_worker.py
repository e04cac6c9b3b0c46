"""The model process as its gevent worker patches it: load threads that import one module for the first
time at once, as concurrent loads do, all finish (with gevent's import locks, one in a few hundred such
imports waited for ever)."""

import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

IMPORTS = """
import importlib, os, sys
from container.gunicorn_worker import Worker

worker = Worker.__new__(Worker)  # its patching alone, as the model process does first
worker.sockets = []
worker.patch()

import gevent
from gevent.threadpool import ThreadPool

directory, tries = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, directory)
threads = ThreadPool(4)
for n in range(tries):
    name = f"fresh_{n}"
    with open(os.path.join(directory, name + ".py"), "w") as module:
        module.write("value = sum(range(20000))\\n")  # an import that takes a moment
    importlib.invalidate_caches()
    imports = [threads.spawn(importlib.import_module, name) for _ in range(4)]
    if len(gevent.joinall(imports, timeout=10)) < len(imports):
        print(f"four threads importing new module {n} at once: one never finished", file=sys.stderr, flush=True)
        os._exit(1)  # its thread cannot be ended
"""


def test_load_threads_importing_one_new_module_at_once_all_finish(tmp_path):
    run = subprocess.run([sys.executable, "-c", IMPORTS, str(tmp_path), "1500"], cwd=PROJECT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
