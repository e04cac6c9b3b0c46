"""How requests reach a model's execution threads. Issue-2 scope: direct execution, one request at a time
per model, off the event loop; batchers plug in behind the same `run` call."""

from container.scheduling.direct import DirectScheduler


def scheduler_for(model_name: str, config=None) -> DirectScheduler:
    """The scheduler a model's config asks for; without one, direct execution."""
    return DirectScheduler(model_name)
