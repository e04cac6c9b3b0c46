"""`python -m container.grpc_api CHANNEL`: the gRPC front-end process, which the gunicorn master starts
(container/frontends.py) beside its worker; CHANNEL is the model process's socket."""

import os
import sys

import uvloop

from container.grpc_api.server import serve
from container.logs import configure_logging
from container.settings import Settings

settings = Settings.from_env(os.environ)
configure_logging(settings.log_level, hub=False)
uvloop.run(serve(settings, sys.argv[1]))  # libuv's loop: grpc.aio's own callbacks are most of a call's cost
