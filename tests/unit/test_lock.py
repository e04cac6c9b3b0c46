"""The locks in requirements/ agree with pyproject.toml, with each other and with what is installed, and
pyproject.toml declares what the server imports."""

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
LOCKS = PROJECT / "requirements"
# Declared for inference.py scripts (SageMaker's PyTorch image has them) or for a dependency that forgets
# to declare it (gunicorn's gevent worker imports packaging), not imported by the server itself.
NOT_IMPORTED = {"six", "pillow", "packaging"}


def read_lock(name: str) -> dict[str, tuple[str, set[str]]]:
    """{package: (version, hashes)} from a pip-compile file."""
    entries = {}
    for block in re.split(r"\n(?=[a-z0-9])", (LOCKS / name).read_text()):
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if match:
            entries[canonicalize_name(match[1])] = (match[2], set(re.findall(r"--hash=sha256:([0-9a-f]{64})", block)))
    return entries


def requirements(group: list[str]) -> list[Requirement]:
    return [Requirement(text) for text in group]


@pytest.mark.parametrize("lock, declared", [
    ("server.lock", PYPROJECT["dependencies"]),
    ("server-cuda.lock", PYPROJECT["dependencies"]),
    ("test.lock", PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["test"]),
])
def test_every_declared_dependency_is_locked_within_its_bounds(lock, declared):
    pins = read_lock(lock)
    for requirement in requirements(declared):
        version, _ = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version, prereleases=True), f"{lock}: {requirement.name}=={version} breaks {requirement}"


@pytest.mark.parametrize("lock", ["server.lock", "server-cuda.lock", "test.lock", "torch.lock"])
def test_every_locked_file_has_a_hash(lock):
    pins = read_lock(lock)
    assert pins and all(hashes for _, hashes in pins.values()), [name for name, (_, h) in pins.items() if not h]


def test_the_image_and_the_tests_install_the_same_pins():
    test, server, cuda = read_lock("test.lock"), read_lock("server.lock"), read_lock("server-cuda.lock")
    assert {name: pin for name, pin in server.items() if test[name] != pin} == {}
    shared = {name: cuda[name] for name in server if name != "torch"}
    assert {name: pin for name, pin in shared.items() if server[name] != pin} == {}


def test_torch_is_the_cpu_build_from_its_own_lock_and_the_cuda_build_for_gpus():
    torch = read_lock("torch.lock")
    assert list(torch) == ["torch"] and torch["torch"][0].endswith("+cpu")
    assert read_lock("server.lock")["torch"] == torch["torch"]
    cuda = read_lock("server-cuda.lock")
    assert "+" not in cuda["torch"][0] and any(name.startswith("nvidia-") for name in cuda)


def test_the_environment_is_the_lock():
    """`make install` installs test.lock: every package of the lock is there at its locked version."""
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    differing = {name: (version, installed.get(name)) for name, (version, _) in read_lock("test.lock").items()
                 if installed.get(name) != version}
    assert differing == {}


def test_the_server_imports_what_pyproject_declares_and_nothing_else():
    imported = set()
    for path in (PROJECT / "container").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "find_spec":  # triton_schema.py
                imported.add(node.args[0].value)
    third_party = imported - set(sys.stdlib_module_names) - {"container", "_socket"}
    providers = {module: {canonicalize_name(d) for d in dists} for module, dists in metadata.packages_distributions().items()}
    declared = {canonicalize_name(r.name) for r in requirements(PYPROJECT["dependencies"])}
    undeclared = {module for module in third_party if not providers[module] & declared}
    assert undeclared == set(), "imported but not declared"
    used = set().union(*(providers[module] & declared for module in third_party))
    assert declared - used == NOT_IMPORTED, "declared but not imported"
