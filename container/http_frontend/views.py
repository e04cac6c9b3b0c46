"""This front-end's views of the models (v2/views.py), which its V2 and TF Serving inferences decode and
encode against, fetched from the model process as they are first needed."""

from typing import Callable

from gevent.event import AsyncResult

from container.channel.hub_client import HubChannelClient
from container.errors import ModelNotFound, ServeError
from container.v2 import views
from container.v2.views import TensorView


class FrontEndViews(views.Views):
    """On the gevent hub."""

    def __init__(self, channel: HubChannelClient):
        super().__init__()
        self.channel = channel

    def get(self, name: str) -> TensorView | None:
        """This front-end's view of `name`; None when the model process has none to give (a handler model,
        a decoupled one, a model not loaded, or it is away)."""
        view = self.views.get(name)
        if view is not None:
            return view
        fetching = self.fetching.get(name)
        if fetching is not None:
            return fetching.get()
        self.fetching[name] = fetching = AsyncResult()
        view = None
        try:
            view = self.keep(name, self.channel.call("v2_view", name))
        except ServeError:
            pass
        finally:  # the requests waiting for this fetch go on, whatever became of it
            del self.fetching[name]
            fetching.set(view)
        return view

    def run(self, name: str, version_named: bool, decode: Callable, cross: Callable) -> tuple | None:
        """A request decoded here against this front-end's view of `name` and run by the model process:
        `decode(view)` is what crosses, or None when refused here; `cross(view, decoded)` the group call's
        answer, empty when the view's load no longer serves (then the request is decoded anew against a
        fresh view, `views.TRIES` times at most). Returns (view, decoded, answer), or None for a request
        to send another way: no view, refused here, or decoded against stale views each time.
        `version_named`: the request named a version or label (`Views.not_found`)."""
        for _ in range(views.TRIES):
            view = self.get(name)
            decoded = view and decode(view)
            if not decoded:
                return None
            try:
                answer = cross(view, decoded)
            except ModelNotFound:
                self.not_found(name, view, version_named)
                raise
            if answer:
                return view, decoded, answer
            self.stale(name, view)  # decoded against a load that no longer serves
        return None
