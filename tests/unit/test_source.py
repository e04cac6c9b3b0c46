import io
import tarfile
import tempfile

import pytest

from container.errors import InvalidModel, InvalidRequest, SourceNotFound
from container.limits import Limits
from container.models.source import (
    SageMakerLayout,
    TritonLayout,
    open_source,
    read_layout,
    repository_entries,
    resolve_url,
)

LIMITS = Limits()


def tar_with(path, members: dict[str, bytes], symlinks: dict[str, str] | None = None,
             hardlinks: dict[str, str] | None = None):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for kind, links in ((tarfile.SYMTYPE, symlinks), (tarfile.LNKTYPE, hardlinks)):
            for name, target in (links or {}).items():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, target
                tar.addfile(info)
    return path


def test_resolve_url(tmp_path):
    (tmp_path / "m").mkdir()
    assert resolve_url(str(tmp_path), "m") == tmp_path / "m"
    assert resolve_url(str(tmp_path), str(tmp_path / "m")) == tmp_path / "m"
    (tmp_path / "link").symlink_to("/etc")
    for url in ("../", "/etc/passwd", "/no/such/file", "m/../../x", "link/passwd"):  # one answer, exists or not
        with pytest.raises(InvalidRequest, match="not a path inside the model root"):
            resolve_url(str(tmp_path), url)
    for url in ("m\0", "x" * 5000, ""):
        with pytest.raises(InvalidRequest):
            resolve_url(str(tmp_path), url)
    with pytest.raises(SourceNotFound):
        resolve_url(str(tmp_path), "missing")


@pytest.mark.parametrize("members, symlinks", [
    ({"../escape.txt": b"x"}, {}),
    ({}, {"link": "/etc/passwd"}),
    ({}, {"link": "../../outside"}),
])
def test_archive_members_cannot_escape(tmp_path, members, symlinks):
    archive = tar_with(tmp_path / "evil.tar.gz", {"model.pt": b"x", **members}, symlinks)
    with pytest.raises(InvalidModel, match="refused"):
        open_source(archive, LIMITS, str(tmp_path))
    assert not (tmp_path.parent / "escape.txt").exists()


@pytest.mark.parametrize("symlinks, hardlinks", [
    ({"sub/link": "../../outside"}, {}),
    ({"dot": "."}, {"hard": "dot/../../etc/passwd"}),  # the kind of chain CPython's filter let through before 3.11.13
    ({"a": "b/../.."}, {}),
    ({"chain": "a/a/a/../../../.."}, {}),
    ({"empty": ""}, {}),
    ({}, {"hard": "/etc/passwd"}),
    ({}, {"hard": "../outside"}),
    ({}, {"hard": "not-extracted-yet"}),
])
def test_links_are_judged_by_our_own_rule_whatever_the_python(tmp_path, monkeypatch, symlinks, hardlinks):
    archive = tar_with(tmp_path / "links.tar.gz", {"model.pt": b"x"}, symlinks, hardlinks)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where extraction makes its scratch directory
    with pytest.raises(InvalidModel, match="link .* leads outside the model's own files"):
        open_source(archive, LIMITS, str(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["links.tar.gz"]  # nothing extracted is left behind


def test_links_inside_the_archive_are_kept(tmp_path):
    archive = tar_with(tmp_path / "links.tar.gz", {"model.pt": b"x", "code/inference.py": b""},
                       {"code/weights.pt": "../model.pt"}, {"copy.pt": "model.pt"})
    source = open_source(archive, LIMITS, str(tmp_path))
    assert (source.directory / "code" / "weights.pt").read_bytes() == b"x" == (source.directory / "copy.pt").read_bytes()
    source.remove_scratch()


def test_absolute_members_land_inside(tmp_path):
    source = open_source(tar_with(tmp_path / "abs.tar.gz", {"/model.pt": b"x"}), LIMITS, str(tmp_path))
    assert source.layout.weights == [source.scratch / "model.pt"]
    source.remove_scratch()


def test_an_archive_deeper_than_python_can_recurse_is_refused_at_any_depth_limit(tmp_path):
    archive = tar_with(tmp_path / "deep.tar.gz", {"/".join(["d"] * 2000) + "/model.pt": b"x"})
    with pytest.raises(InvalidModel, match="SERVE_MAX_ARCHIVE_DEPTH"):
        open_source(archive, LIMITS, str(tmp_path))
    with pytest.raises(InvalidModel, match="cannot be read"):  # the limit raised: still a 400, never a RecursionError
        open_source(archive, Limits(archive_depth=100_000), str(tmp_path))


def test_corrupt_archive(tmp_path):
    (tmp_path / "bad.tar.gz").write_bytes(b"not gzip")
    with pytest.raises(InvalidModel, match="cannot be read"):
        open_source(tmp_path / "bad.tar.gz", LIMITS, str(tmp_path))


def test_archive_with_a_top_folder_and_scratch_cleanup(tmp_path):
    archive = tar_with(tmp_path / "m.tar.gz", {"inner/model.pt": b"weights", "inner/code/inference.py": b""})
    source = open_source(archive, LIMITS, str(tmp_path))
    assert isinstance(source.layout, SageMakerLayout) and (source.directory / "code" / "inference.py").is_file()
    assert source.estimated_bytes() == len(b"weights")
    source.remove_scratch()
    assert not source.scratch.exists()


def test_directory_holding_only_model_tar_gz(tmp_path):
    (tmp_path / "m").mkdir()
    tar_with(tmp_path / "m" / "model.tar.gz", {"model.pth": b"w"})
    assert [p.name for p in open_source(tmp_path / "m", LIMITS, str(tmp_path)).layout.weights] == ["model.pth"]


def test_triton_layout_versions(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}], '
                                           b'"output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}], '
                                           b'"version_policy": {"all": {}}, "version_labels": {"stable": 9}}')
    for version in ("1", "2"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "model.pt").write_bytes(b"12345")
    (tmp_path / "3").mkdir()  # no model file: not a version
    with pytest.raises(InvalidModel, match="version_labels"):
        open_source(tmp_path, LIMITS, str(tmp_path))
    (tmp_path / "config.json").write_bytes((tmp_path / "config.json").read_bytes().replace(b"9", b"2"))
    source = open_source(tmp_path, LIMITS, str(tmp_path))
    assert isinstance(source.layout, TritonLayout) and sorted(source.layout.versions) == [1, 2]
    assert source.estimated_bytes() == 10


def test_repository_entries(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b.tar.gz").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert repository_entries(str(tmp_path)) == [("a", "a"), ("b", "b.tar.gz")]


def test_sagemaker_layout_with_a_config_json_of_its_own(tmp_path):
    """Weights at the top or a code/ directory make a SageMaker model, whatever config.json holds."""
    (tmp_path / "classifier.pth").write_bytes(b"w")
    (tmp_path / "config.json").write_text('{"hidden_size": 768}')
    assert isinstance(read_layout(tmp_path, LIMITS), SageMakerLayout)
    (tmp_path / "classifier.pth").unlink()
    (tmp_path / "code").mkdir()
    assert isinstance(read_layout(tmp_path, LIMITS), SageMakerLayout)


def test_a_python_model_without_a_config_is_recognised_and_waits_for_its_completion(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text("class TritonPythonModel: pass\n")
    (tmp_path / "2").mkdir()  # no model.py: not a version
    layout = read_layout(tmp_path, LIMITS)
    assert isinstance(layout, TritonLayout) and layout.kind == "python" and layout.signature is None
    assert layout.versions == {1: tmp_path / "1" / "model.py"} and layout.config.backend == "python"


def test_an_ensembles_versions_are_its_directories(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "config.pbtxt").write_text(
        'platform: "ensemble"\ninput [{name: "x" data_type: TYPE_FP32 dims: [1]}]\n'
        'output [{name: "y" data_type: TYPE_FP32 dims: [1]}]\n')
    layout = read_layout(tmp_path, LIMITS)
    assert layout.kind == "ensemble" and layout.versions == {1: tmp_path / "1"}
    assert [s.name for s in layout.signature.inputs] == ["x"]
