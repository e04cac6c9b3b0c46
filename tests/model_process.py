"""For a test's child process: the model process's worker as it starts, its patching step alone (which
patches nothing of the standard library, unlike gunicorn's gevent worker)."""

from container.gunicorn_worker import Worker


def patch_as_the_model_process() -> None:
    worker = Worker.__new__(Worker)
    worker.sockets = []
    worker.patch()
