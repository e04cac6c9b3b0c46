"""This front-end's views of the models (v2/views.py), which its V2 and TF Serving inferences decode and
encode against, fetched from the model process as they are first needed."""

from gevent.event import AsyncResult

from container.channel.hub_client import HubChannelClient
from container.errors import ServeError
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
