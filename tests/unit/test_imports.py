"""One-way imports: api → core (the facade) → scheduling → models, backends; models and backends →
neither api nor Flask; front-ends never import torch or the core's internals."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "container"

FORBIDDEN = {
    "models": ("container.api", "container.scheduling", "container.backends", "container.app", "flask", "torch"),
    "backends": ("container.api", "container.scheduling", "container.app", "flask"),
    "scheduling": ("container.api", "container.app", "flask"),
    # Front-ends reach the models through the core facade (container/core.py) alone.
    "api": ("torch", "flask", "container.backends", "container.scheduling", "container.models.registry",
            "container.models.cache", "container.models.downloads", "container.app"),
    # The channel is a transport: it knows no protocol and no model.
    "channel": ("container.api", "container.core", "container.models", "container.scheduling", "container.backends",
                "container.app", "container.grpc_api", "flask", "torch"),
    # The gRPC front-end process reaches the models over the channel alone; nothing there is patched by gevent.
    "grpc_api": ("container.api", "container.core", "container.models", "container.scheduling", "container.backends",
                 "container.app", "flask", "torch", "gevent"),
    # V2's codec and views serve every transport and process: no event loop, no channel, no core.
    "v2": ("container.api", "container.core", "container.channel", "container.grpc_api", "container.http_frontend",
           "container.scheduling", "container.backends", "container.app", "flask", "torch", "gevent", "asyncio", "grpc"),
    # An HTTP front-end process hands its requests to the model process over the channel: no model machinery.
    "http_frontend": ("container.core", "container.models", "container.scheduling", "container.backends", "container.app",
                      "container.grpc_api", "flask", "torch"),
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_downwards(layer):
    offences = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for name in imports(path)
        if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[layer])
    ]
    assert offences == []


def test_shared_leaf_modules_import_no_layer():
    for leaf in ("errors.py", "tensors.py", "content.py", "inference.py", "settings.py", "resources.py", "limits.py",
                 "request_log.py"):
        layers = [n for n in imports(PACKAGE / leaf) if n.split(".")[:2][-1] in FORBIDDEN]
        assert layers == [], leaf


def test_the_grpc_front_end_process_loads_no_model_machinery():
    """What `python -m container.grpc_api` imports: no torch, no core, and gevent never patching anything."""
    code = ("import sys, container.grpc_api.server, container.logs; import gevent.monkey; "
            "print(sorted(m for m in ('torch', 'container.core', 'flask') if m in sys.modules), gevent.monkey.is_anything_patched())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False"]


def test_the_http_front_end_process_loads_no_model_machinery():
    code = ("import sys, container.http_frontend.server, container.logs; "
            "print(sorted(m for m in ('torch', 'container.core', 'container.models.registry', 'flask') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]"]


def test_the_core_facade_sits_below_the_front_ends():
    upward = [n for n in imports(PACKAGE / "core.py") if n.startswith(("container.api", "container.app", "flask"))]
    assert upward == []
