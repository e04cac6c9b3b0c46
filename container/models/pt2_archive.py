"""What a `.pt2` file is, read from its zip directory alone (nothing in it is run or unpickled): an
AOTInductor package or an ExportedProgram, and whether it stays within the archive limits before
torch extracts it."""

import zipfile
from pathlib import Path, PurePosixPath

from container.errors import InvalidModel
from container.limits import Limits

AOTI_PLATFORM = "torch_aoti"  # Triton's, for AOTInductor packages
EXPORT_PLATFORM = "torch_export"  # this server's, for ExportedProgram archives (Triton has none)


def archive_kind(path: Path) -> str:
    """`torch_aoti` or `torch_export`, from the members' names; a file of neither kind is refused."""
    names = _names(path)
    if any("/data/aotinductor/" in f"/{name}" for name in names):
        return AOTI_PLATFORM
    if any(is_program(name) for name in names):
        return EXPORT_PLATFORM
    raise InvalidModel(f"{where(path)} holds neither an AOTInductor package nor an ExportedProgram")


def check_members(path: Path, limits: Limits) -> None:
    """The archive's members stay inside it and within the limits an uploaded archive has: torch
    extracts a package's files before it loads them."""
    listed = members(path)
    if len(listed) > limits.archive_members:
        raise InvalidModel(f"{where(path)} holds more than {limits.archive_members} members (SERVE_MAX_ARCHIVE_MEMBERS)")
    if sum(member.file_size for member in listed) > limits.archive_bytes:
        raise InvalidModel(f"{where(path)} expands to more than {limits.archive_bytes} bytes (SERVE_MAX_ARCHIVE_SIZE)")
    for member in listed:
        parts = PurePosixPath(member.filename).parts
        if member.filename.startswith("/") or ".." in parts or "\\" in member.filename:
            raise InvalidModel(f"{where(path)}: member {member.filename[:100]!r} escapes the archive's directory")
        if len(parts) > limits.archive_depth:
            raise InvalidModel(f"{where(path)}: member {member.filename[:100]!r}… is {len(parts)} levels deep; the "
                               f"limit is {limits.archive_depth} (SERVE_MAX_ARCHIVE_DEPTH)")


def read_member(path: Path, test) -> bytes | None:
    """The first member whose name `test` accepts, or None."""
    with _open(path) as archive:
        for name in archive.namelist():
            if test(name):
                return archive.read(name)
    return None


def is_program(name: str) -> bool:
    """Whether a member is an ExportedProgram's serialized graph (`<archive>/models/<name>.json`)."""
    parts = name.split("/")
    return len(parts) == 3 and parts[1] == "models" and parts[2].endswith(".json")


def members(path: Path) -> list[zipfile.ZipInfo]:
    """The archive's directory: each member's name and size."""
    with _open(path) as archive:
        return archive.infolist()


def _names(path: Path) -> list[str]:
    return [member.filename for member in members(path)]


def _open(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InvalidModel(f"{where(path)} is not a .pt2 archive (torch.export.save or aoti_compile_and_package "
                           f"writes one): {exc}") from None


def where(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"
