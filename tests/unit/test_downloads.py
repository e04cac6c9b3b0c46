"""The download cache's policy on its own: LRU among unused entries, in-use entries kept, 507 when
nothing can make room, partial downloads never indexed, and the order kept across a restart. The
objects come from a stand-in store that writes files; the S3 path itself runs against moto's server
in tests/integration/test_s3.py."""

import pytest
from gevent.threadpool import ThreadPool

from container.errors import InsufficientStorage
from container.models.downloads import DownloadCache
from container.models.s3 import Listing, S3Object


class Store:
    """Objects of `size` bytes under each url; counts downloads."""

    def __init__(self, size: int):
        self.size, self.downloads = size, []

    def listing(self, url):
        return Listing([S3Object(f"{url.key}/model.pt", self.size, "etag")], url.key)

    def download(self, url, listing, into):
        self.downloads.append(url.key)
        (into / "model.pt").write_bytes(b"\0" * self.size)


@pytest.fixture
def pool():
    pool = ThreadPool(2)
    yield pool
    pool.kill()


def cache(tmp_path, pool, store, budget=30):
    return DownloadCache(str(tmp_path / "cache"), budget, pool, store)


def test_unused_entries_leave_least_recently_used_first_and_in_use_ones_stay(tmp_path, pool):
    store = Store(10)
    downloads = cache(tmp_path, pool, store)
    leases = {name: downloads.fetch(f"s3://models/{name}") for name in "xyz"}
    for lease in leases.values():
        lease.release()
    downloads.fetch("s3://models/x").release()  # x is now the most recently used
    kept = downloads.fetch("s3://models/y")  # y in use
    downloads.fetch("s3://models/w")
    assert len(list((tmp_path / "cache").iterdir())) == 3
    assert downloads.counters.evictions == 1 and store.downloads == ["x", "y", "z", "w"]
    downloads.fetch("s3://models/y")  # still there: in use, so never chosen
    downloads.fetch("s3://models/x")  # still there: z was the least recently used
    assert store.downloads == ["x", "y", "z", "w"] and downloads.counters.hits == 4
    kept.release()


def test_no_room_is_507_and_evicts_nothing(tmp_path, pool):
    downloads = cache(tmp_path, pool, Store(20))
    held = downloads.fetch("s3://models/a")
    with pytest.raises(InsufficientStorage, match="use the rest"):
        downloads.fetch("s3://models/b")
    with pytest.raises(InsufficientStorage, match="more than the whole download cache"):
        cache(tmp_path / "other", pool, Store(40)).fetch("s3://models/c")
    assert downloads.used() == 20 and held.path.is_dir()


def test_a_restart_indexes_complete_entries_in_their_order_and_drops_partial_ones(tmp_path, pool):
    store = Store(10)
    first = cache(tmp_path, pool, store)
    for name in "abc":
        first.fetch(f"s3://models/{name}").release()
    first.fetch("s3://models/a").release()  # order now b, c, a
    partial = tmp_path / "cache" / ".partial-dead-beef"
    partial.mkdir()
    (partial / "model.pt").write_bytes(b"half")
    second = cache(tmp_path, pool, store)
    assert not partial.exists() and second.used() == 30
    second.fetch("s3://models/d")  # evicts b, the least recently used before the restart
    second.fetch("s3://models/c")
    second.fetch("s3://models/a")
    assert store.downloads == ["a", "b", "c", "d"]
