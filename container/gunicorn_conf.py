"""gunicorn settings, derived from the same environment as the app (`gunicorn -c python:container.gunicorn_conf`)."""

import os

import gevent

from container.settings import Settings

_settings = Settings.from_env(os.environ)

bind = f"0.0.0.0:{_settings.port}"
workers = 1  # one process owns the models: the cache and the GPU context exist once
worker_class = "gevent"
worker_connections = 1000
timeout = _settings.model_server_timeout
graceful_timeout = 30
keepalive = 75  # longer than the load balancers' idle timeout (60 s), so they close first
loglevel = _settings.log_level.lower()


def post_request(worker, req, environ, resp):
    """Yield between keep-alive requests: a connection with its next request already buffered would
    otherwise be served again before any other greenlet runs (p99 in seconds under load)."""
    gevent.sleep(0)
