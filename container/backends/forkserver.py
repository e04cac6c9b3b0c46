"""Imported once by the fork server that handler-model workers are forked from (`handler_worker.py`),
and nowhere else: importing it is the fork server's set-up.

torch and the handler code are imported here so each worker starts in milliseconds and shares their
pages. SIGTERM and SIGINT are ignored because they reach the whole process group on `docker stop`
or Ctrl-C, while the server still drains requests that need the workers; the fork server ends when
the server does (multiprocessing watches for that), and the workers end with it."""

import signal

import torch  # noqa: F401  (imported to be shared)

from container.backends import handler_worker  # noqa: F401  (the workers' code)

signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
