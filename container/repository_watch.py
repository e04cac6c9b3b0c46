"""Triton's `--model-control-mode=poll` for a local model root (`SERVE_REPOSITORY_POLL_SECONDS`): every
so many seconds the files of the loaded models are looked at. One whose files changed is loaded again
(the old copy serves until the new one does, and serves on if the new one fails to load), one whose
files are gone is unloaded, and with `SERVE_LOAD_MODELS=*` a model that appears in the root is loaded.
A change is acted on once two looks in a row find the same files, so that a model being copied in is
not loaded half-written. Models loaded with a client's config or files, or from S3, are left alone."""

import logging
import os
from pathlib import Path

import gevent

from container.core import Core, State
from container.errors import InvalidRequest, ServeError, SourceNotFound
from container.models.source import resolve_url

log = logging.getLogger(__name__)
_UNSEEN = object()


class RepositoryWatch:
    def __init__(self, core: Core, seconds: float, load_new: bool):
        self._core, self._seconds, self._load_new = core, seconds, load_new
        self._last: dict[str, object] = {}  # url → its files at the last look
        self._served: dict[str, object] = {}  # url → its files as the model serving it was loaded from
        self._known: set[str] | None = None  # the root's entries since the first look
        self._new: dict[str, str] = {}  # name → url of the entries that appeared since, not loaded yet

    def run(self) -> None:
        """In a greenlet of its own, once the models named at start have loaded."""
        self._core.started.wait()
        while True:
            try:
                self.look()
            except Exception:  # a server bug: logged, and the next look tries again
                log.exception("the repository could not be polled")
            gevent.sleep(self._seconds)

    def look(self) -> None:
        loaded = self._core.from_root()
        targets = [(name, url, True) for name, url in loaded.items()]
        if self._load_new:
            targets += [(name, url, False) for name, url in self._appeared(loaded).items()]
        files = gevent.get_hub().threadpool.apply(_files_of, (self._core.model_root, [url for _, url, _ in targets]))
        for (name, url, is_loaded), now in zip(targets, files, strict=True):
            if now is _UNSEEN:
                continue
            if is_loaded:  # taken as loaded from the files of its first look
                self._served.setdefault(url, now)
            before, self._last[url] = self._last.get(url, _UNSEEN), now
            if now != before:  # first seen, or still changing
                continue
            if now != self._served.get(url, _UNSEEN):  # a new model's failed load waits for its files to change
                self._act(name, url, is_loaded, now)
                self._served[url] = now

    def _appeared(self, loaded: dict[str, str]) -> dict[str, str]:
        """Name → url of the entries of the root that were not there at the first look and are not loaded."""
        entries = dict(gevent.get_hub().threadpool.apply(self._core.entries))  # a listing: off the event loop
        if self._known is None:
            self._known = set(entries)
        for name in set(entries) - self._known:
            self._new[name] = entries[name]
        self._known |= set(entries)
        for name in list(self._new):
            if name not in entries or name in loaded or self._core.state(name) is not None:
                del self._new[name]
        return dict(self._new)

    def _act(self, name: str, url: str, is_loaded: bool, files) -> None:
        what = "unload" if files is None else "reload" if is_loaded else "load"
        log.info("the model's files changed", extra={"fields": {"model": name, "url": url, "action": what}})
        try:
            if files is None:
                self._core.unload(name)
                if self._known is not None:
                    self._known.discard(name)  # should it come back, it is a model that appears
            else:
                self._core.load(name, url, reload=is_loaded)
        except ServeError as exc:  # the model as it now is cannot load: the copy serving it serves on
            log.error("the changed model did not load", extra={"fields": {"model": name, "error": str(exc)}})
        if not is_loaded and self._core.state(name) is State.READY:
            self._new.pop(name, None)


def _files_of(root: str, urls: list[str]) -> list:
    """Blocking: for each url, its files (path, size, modification time), None where it is gone, or
    _UNSEEN where it is no path under the root."""
    return [_files(root, url) for url in urls]


def _files(root: str, url: str):
    try:
        path = resolve_url(root, url)
    except SourceNotFound:
        return None
    except InvalidRequest:  # outside the root (an S3 url, say)
        return _UNSEEN
    if path.is_file():
        stat = path.stat()
        return ((".", stat.st_size, stat.st_mtime_ns),)
    found = []
    for directory, _, names in os.walk(path):
        for name in names:
            full = Path(directory) / name
            try:
                stat = full.stat()
            except OSError:  # removed meanwhile
                continue
            found.append((str(full.relative_to(path)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))
