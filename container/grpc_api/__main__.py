"""`python -m container.grpc_api CHANNEL`: the gRPC front-end process, which the gunicorn master starts
(container/frontends.py) beside its worker; CHANNEL is the model process's socket."""

import asyncio
import os
import sys

from container.grpc_api.server import serve
from container.logs import configure_logging
from container.settings import Settings

settings = Settings.from_env(os.environ)
configure_logging(settings.log_level, hub=False)
asyncio.run(serve(settings, sys.argv[1]))
