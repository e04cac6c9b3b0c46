"""Models in S3, through plain boto3: `s3://bucket/prefix/` is a model directory (every object under
it), `s3://bucket/key.tar.gz` one archive. Credentials, region and endpoint come the AWS way (the
default credential chain, AWS_REGION, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 for S3-compatible
stores); throttling and timeouts are retried in botocore's standard retry mode. Nothing here logs a
credential: messages name the bucket and key only."""

import logging
import posixpath
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from container.errors import Forbidden, InvalidModel, InvalidRequest, SourceNotFound, Unavailable

log = logging.getLogger(__name__)
SCHEME = "s3://"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_PROGRESS_SECONDS = 5  # a large download logs its progress this often
_NOT_FOUND = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"}


def is_s3(url: str) -> bool:
    return isinstance(url, str) and url.startswith(SCHEME)


@dataclass(frozen=True)
class S3Url:
    bucket: str
    key: str  # no leading slash; a prefix ends with "/" once listed as one

    @classmethod
    def parse(cls, url: str) -> "S3Url":
        bucket, _, key = url.removeprefix(SCHEME).partition("/")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise InvalidRequest(f"{url[:200]!r} does not name an S3 bucket: expected s3://bucket/key")
        if "\0" in key or any(part in ("..", ".") for part in key.split("/")):
            raise InvalidRequest(f"{url[:200]!r}: an S3 key may not hold '.' or '..' segments")
        return cls(bucket, key)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    def child(self, relative: str) -> "S3Url":
        """`relative` under this url taken as a prefix, refused when it would climb out of it."""
        if not isinstance(relative, str) or not relative.strip() or "\0" in relative:
            raise InvalidRequest("'url' must be a non-empty string naming a model under the model root")
        joined = posixpath.normpath(posixpath.join(self.key.rstrip("/"), relative))
        base = self.key.rstrip("/")
        if relative.startswith("/") or not (joined == base or joined.startswith(base + "/" if base else "")) or joined.startswith(".."):
            raise InvalidRequest(f"url {relative[:200]!r} is not a path inside the model root {str(self)!r}")
        return S3Url(self.bucket, joined)


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int
    etag: str


class S3:
    """One S3 client for the process (boto3 clients are thread-safe; creating one costs ~50 ms)."""

    def __init__(self):
        self._client = None
        self._lock = threading.Lock()  # callers are native threads

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                import boto3
                import botocore.session
                from botocore.config import Config

                # the AWS way first (AWS_RETRY_MODE, AWS_MAX_ATTEMPTS, the profile's), which a Config's own
                # retries would override; where nothing is said, standard mode with 5 retries. AWS's setting
                # counts the first attempt: Config's `total_max_attempts`, not its `max_attempts`.
                aws = botocore.session.get_session()
                retries = {"mode": aws.get_config_variable("retry_mode") or "standard",
                           "total_max_attempts": aws.get_config_variable("max_attempts") or 6}
                self._client = boto3.session.Session(botocore_session=aws).client("s3", config=Config(
                    retries=retries, connect_timeout=10, read_timeout=60, max_pool_connections=32))
            return self._client

    def listing(self, url: S3Url) -> "Listing":
        """The objects a model url stands for: the object itself when the key names one (an archive),
        else every object under `key/` (a model directory), else `key.tar.gz`/`.tgz`/`.tar` (a model's
        name under an S3 root)."""
        with _errors(url):
            if url.key and not url.key.endswith("/"):
                listed = self._list(url.bucket, url.key, limit=1)
                if listed and listed[0].key == url.key:
                    return Listing(listed, posixpath.dirname(url.key))
            prefix = _as_prefix(url.key)
            found = [o for o in self._list(url.bucket, prefix) if not o.key.endswith("/")]
            if not found and url.key and not url.key.endswith("/"):  # a model name: its archive
                for suffix in ARCHIVE_SUFFIXES:
                    listed = self._list(url.bucket, url.key + suffix, limit=1)
                    if listed and listed[0].key == url.key + suffix:
                        return Listing(listed, posixpath.dirname(url.key))
        if not found:
            raise SourceNotFound(f"no object at {url} (nor under {url.key.rstrip('/')}/)")
        return Listing(found, prefix)

    def _list(self, bucket: str, prefix: str, limit: int | None = None) -> list[S3Object]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, PaginationConfig={"MaxItems": limit} if limit else {})
        return [S3Object(item["Key"], item["Size"], item.get("ETag", "")) for page in pages for item in page.get("Contents", [])]

    def entries(self, root: S3Url) -> list[tuple[str, str]]:
        """(name, url relative to the root) of each model directly under the root: its "directories"
        and its archives."""
        prefix = _as_prefix(root.key)
        with _errors(root):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=root.bucket, Prefix=prefix, Delimiter="/")
            entries = []
            for page in pages:
                for common in page.get("CommonPrefixes", []):
                    name = common["Prefix"][len(prefix):].rstrip("/")
                    entries.append((name, name))
                for item in page.get("Contents", []):
                    name = item["Key"][len(prefix):]
                    for suffix in ARCHIVE_SUFFIXES:
                        if name.endswith(suffix):
                            entries.append((name.removesuffix(suffix), name))
        return sorted(entries)

    def download(self, url: S3Url, listing: "Listing", into: Path) -> None:
        """The listed objects into `into` (their keys less the listing's prefix), several at a time, each
        streamed to disk by boto3's transfer manager. Blocking: run it on a thread."""
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        started = time.monotonic()
        progress = _progress(str(url), listing.bytes)
        config = TransferConfig(max_concurrency=8, multipart_chunksize=16 << 20)
        targets = [(item, into / local_path(item.key, listing.prefix)) for item in listing.objects]  # all judged first
        with _errors(url), create_transfer_manager(self.client, config) as manager:
            futures = []
            for item, target in targets:
                target.parent.mkdir(parents=True, exist_ok=True)
                futures.append(manager.download(url.bucket, item.key, str(target), subscribers=[progress]))
            for future in futures:
                future.result()
        seconds = time.monotonic() - started
        log.info("downloaded model", extra={"fields": {"url": str(url), "objects": len(listing.objects),
                                                       "bytes": listing.bytes, "seconds": round(seconds, 3),
                                                       "MB/s": round(listing.bytes / 1e6 / max(seconds, 1e-6), 1)}})


@dataclass(frozen=True)
class Listing:
    objects: list[S3Object]
    prefix: str  # what the keys share, dropped on disk

    @property
    def bytes(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def version(self) -> tuple:
        """Changes when any object changes: a cached copy with another version is stale."""
        return tuple((o.key, o.size, o.etag) for o in self.objects)


def local_path(key: str, prefix: str) -> str:
    """Where the object `key` goes under a model's directory: its key less the listing's prefix, judged
    as a path. S3 keys are any text, so `prefix/../../x` is a key; it is refused, never followed."""
    parts = [part for part in key[len(prefix):].split("/") if part]
    if not parts or any(part in (".", "..") or "\0" in part for part in parts):
        raise InvalidModel(f"object key {key[:200]!r} is not a path inside its model's directory; rename it")
    return "/".join(parts)


def _as_prefix(key: str) -> str:
    return key.rstrip("/") + "/" if key.rstrip("/") else ""


def _progress(url: str, total: int):
    """A transfer subscriber that logs a large download's progress every few seconds."""
    from s3transfer.subscribers import BaseSubscriber

    class Progress(BaseSubscriber):
        def __init__(self):
            self.done, self._lock = 0, threading.Lock()
            self._next = time.monotonic() + _PROGRESS_SECONDS

        def on_progress(self, future, bytes_transferred, **kwargs):
            with self._lock:
                self.done += bytes_transferred
                now = time.monotonic()
                if now < self._next:
                    return
                self._next = now + _PROGRESS_SECONDS
            log.info("downloading model", extra={"fields": {"url": url, "bytes": self.done, "of": total}})

    return Progress()


class _errors:
    """botocore's failures as the answers a user can act on."""

    def __init__(self, url: S3Url):
        self.url = url

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, traceback):
        if exc is None:
            return False
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _NOT_FOUND:
                raise SourceNotFound(f"{self.url} does not exist ({code})") from None
            if code in _DENIED:
                raise Forbidden(f"access to {self.url} is denied ({code}); check the role or credentials "
                                f"the server runs with") from None
            raise Unavailable(f"S3 answered {code or 'an error'} for {self.url} after retries; try again") from None
        if isinstance(exc, BotoCoreError):
            raise Unavailable(f"S3 could not be reached for {self.url} after retries ({type(exc).__name__}); "
                              f"try again") from None
        return False
