"""Triton's checksum repository agent: a config's `model_repository_agents` may name the agent
`checksum` with one parameter per file, `"<algorithm>:<path in the model's directory>": "<hex digest>"`,
and a file whose digest differs fails the model's load before anything of it runs. MD5 as Triton's
agent takes it, and SHA-256 and SHA-512, which an operator who checks files against tampering wants.
Any other agent fails the load too, as in Triton, where its library would be missing."""

import hashlib
import logging
from pathlib import Path

from container.errors import InvalidModel
from container.models.config import relative_path

log = logging.getLogger(__name__)
ALGORITHMS = ("md5", "sha256", "sha512")
_CHUNK = 1 << 20


def verify(directory: Path, config) -> None:
    """Every file the config's checksum agent names has the digest it gives; refused otherwise. The
    answer names the file and the digest expected, never the one found (which the log has)."""
    for agent in config.model_repository_agents.agents:
        if agent.name != "checksum":
            raise InvalidModel(f"model_repository_agents: agent '{agent.name}' is not run here; the 'checksum' "
                               f"agent is")
        for key, expected in sorted(agent.parameters.items()):
            algorithm, colon, relative = key.partition(":")
            if not colon or not relative:  # Triton's words, then how to write it
                raise InvalidModel(f"failed to parse key: {key!r}; the checksum agent's keys are <algorithm>:<file>")
            if algorithm.lower() not in ALGORITHMS:
                raise InvalidModel(f"Unsupported checksum algorithm: {algorithm}; use MD5, SHA256 or SHA512")
            path = directory / relative_path(relative, "the checksum agent's file")
            if not path.is_file():
                raise InvalidModel(f"the checksum agent's file {relative!r} is not a file in the model's directory")
            found = _digest(path, algorithm.lower())
            if found != expected.strip().lower():
                log.error("checksum mismatch", extra={"fields": {"file": relative, "algorithm": algorithm,
                                                                 "expected": expected, "found": found}})
                raise InvalidModel(f"Mismatched {algorithm.upper()} hash for file {relative}, expect: {expected}")


def _digest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
