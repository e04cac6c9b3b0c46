"""The local download cache for models in S3: a directory and a byte budget, separate from the memory
cache. Each entry is one model url's objects at one version (their keys, sizes and ETags), so a model
evicted from memory loads again without a download, and a changed object is fetched anew. Entries
leave least recently used first, and only while no loaded model uses them. A download is written
under a temporary name and renamed when complete: a partial one is never used, and a restart (which
removes leftovers) reuses every complete entry.

Bookkeeping runs on the event loop without yielding between a check and its update, as the registry
does; listing, downloading and deleting run on the thread pool the registry hands in."""

import hashlib
import logging
import os
import shutil
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from gevent.event import AsyncResult

from container.errors import InsufficientStorage, no_room
from container.models.s3 import S3, Listing, S3Url

log = logging.getLogger(__name__)
_TEMPORARY = ".partial-"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


@dataclass(eq=False)
class Entry:
    path: Path  # the model directory, or a directory holding its one archive (extracted at each load)
    bytes: int
    users: int = 0  # loaded (or loading) models that read from it


@dataclass
class DownloadCounters:
    hits: int = 0
    misses: int = 0
    downloads: int = 0
    bytes: int = 0
    seconds: float = 0.0
    evictions: int = 0


@dataclass(eq=False)
class Lease:
    """A model's hold on its entry: the entry stays on disk until the model lets go."""

    entry: Entry
    released: bool = field(default=False)

    @property
    def path(self) -> Path:
        return self.entry.path

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.entry.users -= 1


class DownloadCache:
    def __init__(self, directory: str, budget: int, pool, s3: S3 | None = None):
        self.directory = Path(directory)
        self.budget = budget
        self.counters = DownloadCounters()
        self.s3 = s3 or S3()
        self._pool = pool
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self._fetching: dict[str, AsyncResult] = {}
        self._reserved = 0  # bytes of downloads under way
        self._scan()

    def in_progress(self) -> int:
        return len(self._fetching)

    def used(self) -> int:
        return sum(e.bytes for e in self._entries.values()) + self._reserved

    def fetch(self, url: str) -> Lease:
        """A lease on the local copy of `url`, downloading it first unless a complete copy of the same
        version is cached; concurrent fetches of one url share one download."""
        parsed = S3Url.parse(url)
        listing = self._pool.apply(self.s3.listing, (parsed,))
        key = hashlib.sha256(repr((str(parsed), listing.version)).encode()).hexdigest()[:32]
        while key not in self._entries and key in self._fetching:
            self._fetching[key].get()  # another load downloads it: wait, then take it as cached
        entry = self._entries.get(key)
        if entry is None:
            self.counters.misses += 1
            entry = self._download(key, parsed, listing)
        else:
            self.counters.hits += 1
            self._entries.move_to_end(key)
        entry.users += 1  # held before the next yield: nothing can evict it from here on
        self._pool.apply(os.utime, (entry.path,))  # the order survives a restart
        return Lease(entry)

    def _download(self, key: str, url: S3Url, listing: Listing) -> Entry:
        done = self._fetching[key] = AsyncResult()  # first, so a fetch of the same url from here on waits
        started = time.monotonic()
        try:
            self._make_room(url, listing.bytes)
            partial = self.directory / f"{_TEMPORARY}{key}-{uuid.uuid4().hex[:8]}"
            try:
                self._pool.apply(self._write, (url, listing, partial, self.directory / key))
            except OSError as exc:
                if (full := no_room(exc, f"the download of {url}")) is None:
                    raise
                raise full from None
            finally:
                self._reserved -= listing.bytes
        except BaseException as exc:
            done.set_exception(exc)
            raise
        finally:
            del self._fetching[key]
        self.counters.downloads += 1
        self.counters.bytes += listing.bytes
        self.counters.seconds += time.monotonic() - started
        entry = self._entries[key] = Entry(self.directory / key, listing.bytes)
        done.set(entry)
        return entry

    def _write(self, url: S3Url, listing: Listing, partial: Path, final: Path) -> None:
        """Blocking: download under the temporary name, then rename; nothing partial stays behind."""
        try:
            partial.mkdir(parents=True)
            self.s3.download(url, listing, partial)
            shutil.rmtree(final, ignore_errors=True)  # an entry a crash left unindexed
            partial.rename(final)
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def _make_room(self, url: S3Url, size: int) -> None:
        """Reserve `size` bytes, evicting unused entries, least recently used first, until they fit; 507
        when even that would not do, evicting nothing. The decision and the reservation come before
        the first yield, so two downloads cannot both count on the same room."""
        if size > self.budget:
            raise InsufficientStorage(f"{url} holds {_mib(size)}, more than the whole download cache "
                                      f"(SERVE_DOWNLOAD_CACHE_SIZE={_mib(self.budget)})")
        over = self.used() + size - self.budget
        victims = []
        for key, entry in self._entries.items():
            if over <= 0:
                break
            if not entry.users:
                victims.append(key)
                over -= entry.bytes
        if over > 0:
            raise InsufficientStorage(f"no room in the download cache for {url} ({_mib(size)}): the models "
                                      f"loaded from it use the rest of SERVE_DOWNLOAD_CACHE_SIZE={_mib(self.budget)}")
        removed = [self._entries.pop(key) for key in victims]
        self._reserved += size
        for key, entry in zip(victims, removed, strict=True):
            self.counters.evictions += 1
            self._pool.apply(shutil.rmtree, (entry.path, True))
            log.info("evicted download", extra={"fields": {"entry": key, "bytes": entry.bytes}})

    def _scan(self) -> None:
        """Index the complete entries a previous run left, oldest use first; drop partial ones."""
        if not self.directory.is_dir():
            return
        found = []
        for path in self.directory.iterdir():
            if path.name.startswith(_TEMPORARY) or not path.is_dir():
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
                continue
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            found.append((path.stat().st_mtime, path.name, Entry(path, size)))
        for _, key, entry in sorted(found):
            self._entries[key] = entry
