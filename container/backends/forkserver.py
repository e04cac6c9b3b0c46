"""The process user code's workers are forked from, and the server's side of it.

The fork server imports torch and the workers' code once, so a worker starts in milliseconds and
shares their pages. It forks a child for each start it is asked for, writes the child's exit status
to the status pipe that start brought, and ends when the model process does (its socket reads EOF);
its children end with it (PR_SET_PDEATHSIG, set in each child: its parent is this process's one thread).

Why not multiprocessing's fork server: its client is called from several native threads at once (the
hub's thread pool, the instances' threads), and while the model process was monkey-patched its locks
and socket were gevent's: a wake-up lost between threads left one load connected to the fork server
without a word sent; the fork server, which reads one connection at a time, waited for it for ever,
and every later start waited behind it (measured at bd38afa: eight concurrent handler loads hung at the
first round). Here a start is one message each way on one socket, one start at a time behind a lock,
and each wait is bounded: a fork server that does not answer is killed and the next start makes a new
one.
"""

import atexit
import contextlib
import logging
import os
import select
import signal
import struct
import sys
import threading

from container import resources
from container.errors import ModelError

# A fork takes milliseconds, a new fork server's imports seconds: one silent this long is stuck. Starts
# queue behind one another for at most twice as long.
_ANSWER_SECONDS = 60
_STATUS = struct.Struct("i")
_MAIN = "import sys; from container.backends.forkserver import main; main(int(sys.argv[1]))"


def _readable(fds: list[int], timeout: float | None) -> set[int]:
    """Which of `fds` can be read within `timeout` seconds (None: wait for one). poll: the waits
    here block their native thread, never the loop, and a descriptor may be past select's 1024."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)  # and POLLHUP and POLLERR, which poll always reports
    return {fd for fd, _ in poller.poll(None if timeout is None else timeout * 1000)}


class Child:
    """A process the fork server made: its pid, and the pipe that becomes readable when it exits."""

    def __init__(self, pid: int, sentinel: int):
        self.pid, self.sentinel = pid, sentinel
        self.exit_code: int | None = None

    def wait(self, timeout: float | None) -> int | None:
        """Its exit code (negative: the signal that ended it), or None while it still runs after
        `timeout` seconds. 255 when the fork server went away before it could tell."""
        if self.exit_code is None:
            if not _readable([self.sentinel], timeout):
                return None
            status = os.read(self.sentinel, _STATUS.size)
            self.exit_code = _STATUS.unpack(status)[0] if len(status) == _STATUS.size else 255
        return self.exit_code

    def kill(self) -> None:
        if self.exit_code is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        os.close(self.sentinel)


class ForkServer:
    """The model process's side: `spawn` asks for a child and returns it. Any thread may call it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._socket = None

    def spawn(self, connection_fd: int, runtimes: tuple[str, ...] = ()) -> Child:
        """A new process, given a copy of `connection_fd`: the first message it reads there is
        `(target, args)`, and it runs `target(connection, *args)`. `runtimes` (such as pt2.EXPORT_RUNTIME)
        are those it will use: prepared first, once, in the fork server, whose children then share them."""
        status_read, status_write = os.pipe()
        try:
            if not self._lock.acquire(timeout=2 * _ANSWER_SECONDS):
                raise ModelError(f"no model worker could be started within {2 * _ANSWER_SECONDS} s: other starts held "
                                 f"the fork server; retry")
            try:
                pid = self._ask([connection_fd, status_write], runtimes)
            finally:
                self._lock.release()
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        return Child(pid, status_read)

    def held(self) -> int:
        """Its anonymous resident bytes (the heap its imports made); 0 while it does not run."""
        return resources.anonymous_bytes(self._pid) if self._socket is not None else 0

    def stop(self) -> None:
        """Ends the fork server, and with it every child (at exit, once the server has drained)."""
        with self._lock:
            self._end()

    def _ask(self, fds: list[int], runtimes: tuple[str, ...]) -> int:
        import _socket

        request = [" ".join(("f", *runtimes)).encode()], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        try:
            try:
                server = self._running()
                server.sendmsg(*request)
            except OSError:  # it had ended (killed) before this start, which it never saw: a new one makes it
                self._end()
                server = self._running()
                server.sendmsg(*request)
            if not _readable([server.fileno()], _ANSWER_SECONDS):
                raise TimeoutError(f"no answer within {_ANSWER_SECONDS} s")
            answer = server.recv(32)
            if not answer:
                raise EOFError("it ended")
            return int(answer)
        except (OSError, EOFError, ValueError) as exc:
            self._end()  # the next start makes a new one
            raise ModelError(f"the fork server that starts model workers failed ({exc}); it was replaced, "
                             f"and the next load starts it again") from None

    def _running(self):
        import _socket

        if self._socket is None:
            if self._pid is None:  # the first: workers ignore SIGTERM, and end with their fork server
                atexit.register(self.stop)
            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
            os.set_inheritable(theirs.fileno(), True)
            try:
                # -c rather than -m: the package imports this module, which runpy would then run twice
                self._pid = os.posix_spawn(sys.executable, [sys.executable, "-c", _MAIN, str(theirs.fileno())], os.environ)
            finally:
                theirs.close()
            self._socket = ours
        return self._socket

    def _end(self) -> None:
        if self._socket is None:
            return
        self._socket.close()
        self._socket = None
        try:
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
        except ChildProcessError:  # reaped already
            pass


# -- the fork server itself ------------------------------------------------------------------------------


def main(fd: int) -> None:
    """Serve starts until the model process hangs up. SIGTERM and SIGINT are ignored: they reach the
    whole process group on `docker stop` or Ctrl-C, while the server still drains requests that need
    the workers."""
    import socket

    import torch  # imported once, to be shared

    from container.backends import handler_worker, pt2, python_backend  # noqa: F401  (the workers' code)

    # torch.export's fake tensors ask whether CUDA is available, which starts CUDA's driver in a build with
    # CUDA, and a process forked after that cannot use CUDA: there each worker imports the modules itself
    runtimes = {} if torch.backends.cuda.is_built() else {pt2.EXPORT_RUNTIME: pt2.prepare_export}

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Not PR_SET_PDEATHSIG here: it fires when the *thread* that started this process ends (a thread of
    # the hub's pool); the model process's end reaches this process as its socket's EOF instead.
    control = socket.socket(fileno=fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # delivered as a byte on wake_read
    statuses: dict[int, int] = {}  # child pid → its status pipe
    while True:
        ready = _readable([control.fileno(), wake_read], None)
        if wake_read in ready:
            os.read(wake_read, 512)
            _reap(statuses)
        if control.fileno() in ready:
            try:
                asked, fds, _, _ = socket.recv_fds(control, 256, 2)
            except OSError:
                return
            if len(fds) != 2:  # EOF: the model process has gone
                return
            connection_fd, status_write = fds
            for runtime in asked.decode().split()[1:]:
                prepare = runtimes.pop(runtime, None)  # once
                if prepare is not None:
                    with contextlib.suppress(Exception):  # then each child imports what it needs, and says why it fails
                        prepare()
            pid = os.fork()
            if pid == 0:
                control.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for descriptor in (wake_read, wake_write, status_write, *statuses.values()):
                    os.close(descriptor)
                os._exit(_child(connection_fd))
            os.close(connection_fd)
            statuses[pid] = status_write
            control.send(str(pid).encode())


def _reap(statuses: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        write = statuses.pop(pid, None)
        if write is not None:
            try:
                os.write(write, _STATUS.pack(os.waitstatus_to_exitcode(status)))
            except OSError:  # nobody reads it any more
                pass
            os.close(write)


def _child(connection_fd: int) -> int:
    """In the forked child: read what to run from the worker's own socket, run it, give its exit code.
    The message is unpickled as every message between the server and its workers is (worker_process):
    the other end of that socket pair is the model process's, made by it; no client reaches it."""
    from multiprocessing.connection import Connection

    from container.backends.worker_process import receive

    resources.die_with_parent()
    connection = Connection(connection_fd)
    try:
        target, args = receive(connection)
        target(connection, *args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # in the server's JSON lines once the worker has set them up, as it does first
        logging.getLogger(__name__).exception("a worker process ended with an error")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code
