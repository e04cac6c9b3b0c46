"""The WSGI entry gunicorn loads (`container.wsgi:app`): the one module that does work at import."""

import os

import gevent

from container.app import create_app, load_startup_models
from container.settings import Settings

settings = Settings.from_env(os.environ)
app = create_app(settings)
gevent.spawn(load_startup_models, app, settings)  # /ping answers meanwhile
