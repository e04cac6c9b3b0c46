"""`python -m container.grpc_api CHANNEL shared|alone`: a gRPC front-end process, which the gunicorn
master starts (container/frontends.py) beside its worker; CHANNEL is the model process's socket;
`shared`: it shares the port with the other gRPC front-ends (SO_REUSEPORT)."""

import os
import sys

# posix_spawn (frontends.py) leaves the master's inheritable descriptors open here, its HTTP listener
# among them: an orphan front-end would hold port 8080. None is this process's.
os.closerange(3, os.sysconf("SC_OPEN_MAX"))

# gRPC's C core writes its own lines to stderr, which are not JSON; GRPC_VERBOSITY=ERROR shows them
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import uvloop  # after the descriptors are closed: nothing an import opens is lost

from container.grpc_api.server import serve
from container.logs import configure_logging
from container.resources import freeze_start_up
from container.settings import Settings

settings = Settings.from_env(os.environ)
configure_logging(settings.log_level, hub=False)
freeze_start_up()
uvloop.run(serve(settings, sys.argv[1], sys.argv[2] == "shared"))  # libuv's loop: grpc.aio's own callbacks are most of a call's cost
