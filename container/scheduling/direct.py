"""Direct execution on a real OS thread of the model's own, waited on without blocking the gevent hub."""

from gevent.threadpool import ThreadPool


class DirectScheduler:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self._thread = ThreadPool(1)

    def run(self, fn, *args):
        """Run `fn(*args)` on the execution thread; only the calling greenlet waits. Exceptions propagate."""
        return self._thread.apply(fn, args)

    def close(self) -> None:
        self._thread.kill()
