"""Model directories that live only in the server's own storage: what a V2 `load` request builds from
its `config` parameter and `file:<version>/<name>` contents."""

import os
import shutil
import tempfile
from pathlib import Path

from container.errors import InvalidModel, InvalidRequest
from container.models.config import parse_json_config
from container.models.source import inside

CONFIG_FILES = ("config.pbtxt", "config.json")


def build_override(config: str, files: dict[str, bytes], base: Path | None) -> Path:
    """A new directory holding `config` as config.json and either `files` or, without files, every
    other entry of `base` (linked, not copied). Blocking; the caller owns and removes the directory."""
    parse_json_config(config.encode())  # a bad config is refused before anything is written
    directory = Path(tempfile.mkdtemp(prefix="override-"))
    try:
        (directory / "config.json").write_text(config)
        if files:
            for relative, data in files.items():
                target = inside(directory, relative, "file:")
                if target.relative_to(directory).as_posix() in CONFIG_FILES:
                    raise InvalidModel(f"file:{relative}: the configuration comes from the 'config' parameter")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        else:
            if base is None or not base.is_dir():
                raise InvalidRequest("a config override without files needs the model as a directory under the model root")
            for entry in base.iterdir():
                if entry.name not in CONFIG_FILES:
                    os.symlink(entry.resolve(), directory / entry.name)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory

