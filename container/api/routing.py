"""The route table: every URL the server answers, in one list, matched segment by segment (a dict
lookup per segment, no regular expression per request). A path that matches no route is a 404; a path
whose route does not take the method is a 405 that says which methods it does take. A mount gives a
prefix its own error spelling and its own answer to a miss (TF Serving calls both malformed)."""

from dataclasses import dataclass, field
from typing import Callable

from werkzeug.exceptions import MethodNotAllowed, NotFound

from container.api.errors import json_error
from container.settings import API_GROUPS


@dataclass(frozen=True)
class Route:
    method: str
    template: str  # "/v2/models/{name}/versions/{version}/infer"; a segment may be "{name}:predict"
    handler: Callable  # (Request) → Response
    api: str  # its group among settings.API_GROUPS, which SERVE_RESTRICTED_API may put behind a header
    doc: dict = field(compare=False, repr=False)  # its OpenAPI operation (api/openapi.py); the path parameters come from the template

    def __post_init__(self):
        if self.api not in API_GROUPS:
            raise ValueError(f"{self.method} {self.template}: API group {self.api!r} is not one of {API_GROUPS}")


@dataclass(frozen=True)
class Mount:
    """Routes under `prefix` render errors with `error_body`, and a miss under it raises `miss(method, path)`."""

    prefix: str
    error_body: Callable[[str], bytes]
    miss: Callable[[str, str], Exception] | None = None


@dataclass(frozen=True)
class Match:
    route: Route
    params: dict[str, str]


@dataclass
class _Node:
    methods: dict[str, Route] = field(default_factory=dict)
    static: dict[str, "_Node"] = field(default_factory=dict)
    params: list[tuple[str, str, "_Node"]] = field(default_factory=list)  # (name, suffix, node), longest suffix first


class Routes:
    def __init__(self, routes: list[Route], mounts: list[Mount] = ()):
        self.routes = routes
        self.mounts = list(mounts)
        self._exact: dict[str, _Node] = {}  # templates without parameters, by path: one lookup
        self._root = _Node()
        for route in routes:
            node = self._exact.setdefault(route.template, _Node()) if "{" not in route.template else self._insert(route.template)
            if route.method in node.methods:
                raise ValueError(f"{route.method} {route.template} is routed twice")
            node.methods[route.method] = route

    def _insert(self, template: str) -> _Node:
        node = self._root
        for segment in template.split("/")[1:]:
            if segment.startswith("{"):
                name, _, suffix = segment[1:].partition("}")
                found = next((n for p, s, n in node.params if (p, s) == (name, suffix)), None)
                if found is None:
                    found = _Node()
                    node.params.append((name, suffix, found))
                    node.params.sort(key=lambda entry: -len(entry[1]))
                node = found
            else:
                node = node.static.setdefault(segment, _Node())
        return node

    def match(self, method: str, path: str) -> Match:
        """The route for `method path` and its parameters; raises NotFound or MethodNotAllowed."""
        params: dict[str, str] = {}
        node = self._exact.get(path) or _walk(self._root, path.split("/")[1:], params)
        if node is None or not node.methods:
            raise self._miss(method, path, NotFound())
        route = node.methods.get(method) or (node.methods.get("GET") if method == "HEAD" else None)
        if route is None:
            allowed = sorted({*node.methods, *(["HEAD"] if "GET" in node.methods else [])})
            raise self._miss(method, path, MethodNotAllowed(valid_methods=allowed))
        return Match(route, params)

    def error_body(self, path: str) -> Callable[[str], bytes]:
        """How an error on `path` is written: its mount's spelling, else `{"error": "…"}`."""
        mount = self._mount(path)
        return mount.error_body if mount else json_error

    def _miss(self, method: str, path: str, default: Exception) -> Exception:
        mount = self._mount(path)
        return mount.miss(method, path) if mount and mount.miss else default

    def _mount(self, path: str) -> Mount | None:
        return next((mount for mount in self.mounts if path.startswith(mount.prefix)), None)


def _walk(node: _Node, segments: list[str], params: dict[str, str]) -> _Node | None:
    """The node `segments` lead to, filling `params`; a literal segment wins over a parameter."""
    if not segments:
        return node
    segment, rest = segments[0], segments[1:]
    static = node.static.get(segment)
    if static is not None:
        found = _walk(static, rest, params)
        if found is not None and found.methods:
            return found
    for name, suffix, child in node.params:
        value = segment[:len(segment) - len(suffix)] if suffix else segment
        if not value or (suffix and (not segment.endswith(suffix) or ":" in value)):
            continue
        found = _walk(child, rest, params)
        if found is not None and found.methods:
            params[name] = value
            return found
    return None
