"""S3 urls are judged by their text before S3 is asked anything: a bucket name S3 would refuse, a key
with dot segments, or a name that climbs out of an S3 model root is a 400."""

import pytest

from container.errors import InvalidRequest
from container.models.s3 import S3Url


@pytest.mark.parametrize("url, bucket, key", [
    ("s3://models/repo/a", "models", "repo/a"),
    ("s3://models/repo/a/", "models", "repo/a/"),
    ("s3://my.bucket-1/x.tar.gz", "my.bucket-1", "x.tar.gz"),
    ("s3://models", "models", ""),
])
def test_urls_parse_into_bucket_and_key(url, bucket, key):
    assert S3Url.parse(url) == S3Url(bucket, key)


@pytest.mark.parametrize("url", ["s3://", "s3://Upper/x", "s3://a/x", "s3://bad_bucket/x", "s3://b..b/x", "s3://models/../x",
                                 "s3://models/a/./b", "s3://models/a\0b"])
def test_hostile_or_impossible_urls_are_400(url):
    with pytest.raises(InvalidRequest):
        S3Url.parse(url)


@pytest.mark.parametrize("root, relative, expected", [
    ("s3://models/repo", "a", "s3://models/repo/a"),
    ("s3://models/repo/", "a.tar.gz", "s3://models/repo/a.tar.gz"),
    ("s3://models", "a", "s3://models/a"),
    ("s3://models/repo", "a/b/../c", "s3://models/repo/a/c"),
])
def test_names_resolve_under_the_root(root, relative, expected):
    assert str(S3Url.parse(root).child(relative)) == expected


@pytest.mark.parametrize("relative", ["../other", "/etc/passwd", "a/../../x", "", " ", "..", "a\0"])
def test_names_that_leave_the_root_are_400(relative):
    with pytest.raises(InvalidRequest):
        S3Url.parse("s3://models/repo").child(relative)
