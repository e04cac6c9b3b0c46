"""The WSGI entry gunicorn loads (`container.wsgi:app`): the one module that does work at import."""

import os

import gevent

from container import resources, workdirs
from container.app import create_app, load_startup_models
from container.repository_watch import RepositoryWatch
from container.settings import Settings

settings = Settings.from_env(os.environ)
# the model process's scratch, which its master removes when it exits (gunicorn_conf.child_exit)
app = create_app(settings, workdirs.make_private(workdirs.scratch(os.getppid(), os.getpid())))
resources.freeze_start_up()  # torch and the app: the collections that unloading runs skip them
gevent.spawn(load_startup_models, app, settings)  # /ping answers meanwhile
if settings.repository_poll_seconds:
    gevent.spawn(RepositoryWatch(app.extensions["core"], settings.repository_poll_seconds, settings.load_models == ("*",)).run)
