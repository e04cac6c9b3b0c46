"""The model process as its gevent worker starts it. Its native threads (loads, executions, downloads)
meet whatever a module made: a lock, a condition, a queue, a logging handler, the import system's
locks. Made by gevent's monkey-patching, each could leave a thread waiting for ever, its wake-up lost
between two threads' hubs (the import locks: one in a few hundred imports; a handler's lock: at once);
a thread's child process raised (gevent's `waitpid` watches children on the main thread's loop alone);
a descriptor it closed stayed open; and threads that used a socket, as boto3's transfer threads do,
each left a hub's thread pool behind. So the worker patches nothing: each kind, taken by four pool
threads at once, lets every one of them finish, and the listeners it serves are gevent's, whose waits
yield to the loop's other greenlets."""

import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]

CONTENDED = """
import functools, importlib, logging, os, queue, socket, subprocess, sys, threading
from concurrent.futures import ThreadPoolExecutor
from tests.model_process import patch_as_the_model_process
patch_as_the_model_process()

import gevent
from gevent.threadpool import ThreadPool

kind, directory, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, directory)
lock, rlock, condition, items = threading.Lock(), threading.RLock(), threading.Condition(), queue.Queue()
devnull = os.open(os.devnull, os.O_WRONLY)
handler = logging.StreamHandler(open(devnull, "w", closefd=False))  # its lock is made now, after the patch
logger = logging.getLogger("contended")
logger.addHandler(handler)
logger.propagate = False
turns = [0]


def hold(take, n, me):
    for _ in range(200):
        with take:
            os.write(devnull, b"x")  # a call that lets go of the GIL while the lock is held, as a log line's write does


def hand_over(n, me):  # two threads put, two take, and wait for the others' items
    for _ in range(200):
        items.put(me) if me < 2 else items.get(timeout=10)


def take_turns(n, me):  # each waits on the condition for its own turn, which the one before gives it
    for _ in range(50):
        with condition:
            assert condition.wait_for(lambda: turns[0] % 4 == me, timeout=10), "no turn came"
            os.write(devnull, b"x")
            turns[0] += 1
            condition.notify_all()


def log(n, me):
    for i in range(200):
        logger.warning("line %d", i)


def fresh_import(n, me):
    importlib.import_module(f"fresh_{n}")


def child_process(n, me):
    subprocess.run(["/bin/true"], check=True, timeout=10)


def sockets(n, me):  # as boto3's transfer threads: eight threads, each with a socket, then gone
    def talk(_):
        socket.getaddrinfo("127.0.0.1", 443)  # as a connection to an S3 endpoint looks its address up
        ours, theirs = socket.socketpair()
        ours.sendall(b"x")
        assert theirs.recv(1) == b"x"
        ours.close()
        theirs.close()
    with ThreadPoolExecutor(8) as executor:
        list(executor.map(talk, range(8)))


def close(n, me):
    gevent.get_hub()  # the thread's own hub: under gevent's patching its closes waited for that hub's loop
    reader, writer = os.pipe()
    os.close(writer)
    assert os.read(reader, 1) == b"", "the pipe's reader saw no end: its writer was never closed"  # or waits for ever
    os.close(reader)


work = {"lock": functools.partial(hold, lock), "rlock": functools.partial(hold, rlock), "queue": hand_over,
        "condition": take_turns, "logging": log, "import": fresh_import, "process": child_process, "close": close,
        "sockets": sockets}[kind]
threads = ThreadPool(4)
for n in range(rounds):
    if kind == "import":
        with open(os.path.join(directory, f"fresh_{n}.py"), "w") as module:
            module.write("value = sum(range(20000))\\n")  # an import that takes a moment
        importlib.invalidate_caches()
    turns[0] = 0
    calls = [threads.spawn(work, n, me) for me in range(4)]
    if len(gevent.joinall(calls, timeout=10)) < len(calls):
        print(f"{kind}, round {n}: one of four threads never finished", file=sys.stderr, flush=True)
        os._exit(1)  # its thread cannot be ended
    for call in calls:
        call.get()
left = len(os.listdir("/proc/self/task"))
assert left <= 16, f"{left} threads left after {rounds} rounds"  # this one, the pool's four, and little else
"""

LOOP = """
import socket
from container.gunicorn_worker import Worker

class Listener:  # as gunicorn hands its worker a listener
    FAMILY = socket.AF_INET
    sock = socket.create_server(("127.0.0.1", 0))

worker = Worker.__new__(Worker)
worker.sockets = [Listener()]
worker.patch()

import gevent, gevent.monkey, gevent.socket
assert not gevent.monkey.is_anything_patched(), gevent.monkey.saved
listener = worker.sockets[0]
accepting = gevent.spawn(listener.accept)  # runs first: a listener that blocked the thread would wait for ever here
connecting = gevent.spawn(gevent.socket.create_connection, listener.getsockname())
assert accepting.get(timeout=10) and connecting.get(timeout=10)
"""


@pytest.mark.parametrize("kind, rounds", [("lock", 300), ("rlock", 300), ("condition", 100), ("queue", 100),
                                          ("logging", 50), ("import", 1500), ("process", 20), ("close", 20),
                                          ("sockets", 20)])
def test_what_four_native_threads_meet_in_the_model_process_lets_each_finish(tmp_path, kind, rounds):
    run = subprocess.run([sys.executable, "-c", CONTENDED, kind, str(tmp_path), str(rounds)], cwd=PROJECT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_worker_patches_nothing_and_its_listeners_yield_to_the_loop():
    run = subprocess.run([sys.executable, "-c", LOOP], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
