"""Model directories that live only in the server's own storage: what a V2 `load` request builds from
its `config` parameter and `file:<version>/<name>` contents."""

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from container.errors import InvalidModel, InvalidRequest, no_room
from container.models.config import parse_json_config, relative_path

CONFIG_FILES = ("config.pbtxt", "config.json")


def build_override(config: str, files: dict[str, bytes], base: Path | None, scratch_root: str | None = None) -> Path:
    """A new directory under `scratch_root` (default the temporary directory) holding `config` as config.json
    and either `files` or, without files, every other entry of `base` (linked, not copied). Blocking; the
    caller owns and removes the directory."""
    parse_json_config(config.encode())  # a bad config is refused before anything is written
    directory = Path(tempfile.mkdtemp(prefix="override-", dir=scratch_root))
    try:
        (directory / "config.json").write_text(config)
        if files:
            for relative, data in _file_tree(files).items():
                target = directory / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        else:
            if base is None or not base.is_dir():
                raise InvalidRequest("a config override without files needs the model as a directory under the model root")
            for entry in base.iterdir():
                if entry.name not in CONFIG_FILES:
                    os.symlink(entry.resolve(), directory / entry.name)
    except OSError as exc:  # a name no file system takes, or no room
        shutil.rmtree(directory, ignore_errors=True)
        named = os.path.relpath(exc.filename, directory) if exc.filename else "a file"  # not the server's path
        raise (no_room(exc, f"the model's files ({named})")
               or InvalidRequest(f"the model's files cannot be written: {exc.strerror}: {named}")) from None
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def _file_tree(files: dict[str, bytes]) -> dict[str, bytes]:
    """`file:` parameters by their normalised path, refusing two names for one file and a file where
    another needs a directory (`file:1` beside `file:1/model.pt`)."""
    tree: dict[str, bytes] = {}
    written_as: dict[str, str] = {}
    for relative, data in files.items():
        normal = relative_path(relative, "file:")
        if normal in CONFIG_FILES:
            raise InvalidModel(f"file:{relative}: the configuration comes from the 'config' parameter")
        if normal in tree:
            raise InvalidRequest(f"file:{relative} and file:{written_as[normal]} name the same file")
        tree[normal], written_as[normal] = data, relative
    for normal in tree:
        folder = next((str(p) for p in PurePosixPath(normal).parents if str(p) in tree), None)
        if folder is not None:
            raise InvalidRequest(f"file:{written_as[normal]} needs {folder!r} to be a directory, but file:{written_as[folder]} is a file")
    return tree

