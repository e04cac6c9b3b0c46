"""`python -m container.http_frontend CHANNEL LIMITS FD [FD…]`: an HTTP front-end process, which the
gunicorn master starts (container/frontends.py). CHANNEL is the model process's socket, LIMITS gunicorn's
bounds on a request head as JSON (http_transport.HeadLimits, with its graceful timeout), each FD one of
the master's listeners, left open across the spawn."""

import json
import os
import sys

_LISTENERS = sorted(int(fd) for fd in sys.argv[3:])
# posix_spawn (frontends.py) leaves every inheritable descriptor of the master open here; only the
# listeners are this process's
for low, high in zip([2, *_LISTENERS], [*_LISTENERS, os.sysconf("SC_OPEN_MAX")], strict=True):
    os.closerange(low + 1, high)

from container.http_frontend.server import serve  # noqa: E402 (after the descriptors are closed)
from container.http_transport import HeadLimits  # noqa: E402
from container.logs import configure_logging  # noqa: E402
from container.resources import freeze_start_up  # noqa: E402
from container.settings import Settings  # noqa: E402

settings = Settings.from_env(os.environ)
configure_logging(settings.log_level)
limits = json.loads(sys.argv[2])
freeze_start_up()
serve(settings, sys.argv[1], HeadLimits(**limits["head"]), limits["graceful_timeout"], _LISTENERS)
