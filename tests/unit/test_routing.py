"""The route table and the pipeline, without a server: every URL the app has resolves to its own route,
misses are 404 or 405 (with Allow) from the table itself, TF Serving's prefix answers in its own words,
and the pipeline applies one body limit, one request id and one error renderer to every route."""

import orjson
import pytest
from werkzeug.exceptions import MethodNotAllowed, NotFound

from container.api.pipeline import Dispatcher, Request, Response, request_path
from container.api.routing import Mount, Route, Routes
from container.api.tfserving_json import MOUNT
from container.app import create_app, load_startup_models
from container.errors import InvalidRequest, ModelNotFound
from container.settings import Settings


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    settings = Settings.from_env({"SERVE_MODEL_ROOT": str(tmp_path_factory.mktemp("models"))})
    app = create_app(settings)
    load_startup_models(app, settings)  # none: the server is ready at once
    return app


def concrete(template: str) -> tuple[str, dict[str, str]]:
    """A path for `template`, with a value for each parameter."""
    values = {"name": "m-1.x", "version": "7", "label": "stable"}
    path, params = template, {}
    for key, value in values.items():
        if "{" + key + "}" in path:
            path, params[key] = path.replace("{" + key + "}", value), value
    return path, params


def test_every_url_of_the_app_reaches_its_own_route(app):
    routes = app.extensions["dispatcher"].routes
    assert len(routes.routes) > 50
    for route in routes.routes:
        path, params = concrete(route.template)
        match = routes.match(route.method, path)
        assert (match.route, match.params) == (route, params), route.template


def test_every_url_is_routed_once(app):
    keys = [(route.method, route.template) for route in app.extensions["dispatcher"].routes.routes]
    assert len(keys) == len(set(keys))
    with pytest.raises(ValueError, match="routed twice"):
        Routes([Route("GET", "/a/{x}", print, "metadata", {}), Route("GET", "/a/{x}", print, "metadata", {})])


def handler(request):
    return Response(b"")


TABLE = Routes([
    Route("GET", "/v2/models/stats", handler, "metadata", {}), Route("GET", "/v2/models/{name}", handler, "metadata", {}),
    Route("POST", "/v2/models/{name}/infer", handler, "metadata", {}), Route("GET", "/models", handler, "metadata", {}),
    Route("POST", "/models", handler, "metadata", {}), Route("GET", "/v1/models/{name}", handler, "metadata", {}),
    Route("POST", "/v1/models/{name}:predict", handler, "metadata", {}), Route("POST", "/v1/models/{name}/versions/{version}:predict", handler, "metadata", {}),
], mounts=[MOUNT])


@pytest.mark.parametrize("path, template, params", [
    ("/v2/models/stats", "/v2/models/stats", {}),  # a literal segment wins over a parameter
    ("/v2/models/statsx", "/v2/models/{name}", {"name": "statsx"}),
    ("/v2/models/a:b", "/v2/models/{name}", {"name": "a:b"}),  # V2 names may hold ':'
    ("/v1/models/m:predict", "/v1/models/{name}:predict", {"name": "m"}),
    ("/v1/models/m/versions/3:predict", "/v1/models/{name}/versions/{version}:predict", {"name": "m", "version": "3"}),
])
def test_matches(path, template, params):
    method = "POST" if template.endswith(("infer", "predict")) else "GET"
    match = TABLE.match(method, path)
    assert (match.route.template, match.params) == (template, params)


@pytest.mark.parametrize("path", ["/", "", "/v2/models", "/v2/models/", "/v2/models//infer", "/v2/models/m/infer/",
                                  "/models/", "/nope", "/v2/models/m/infer/x"])
def test_unknown_paths_are_404(path):
    with pytest.raises(NotFound):
        TABLE.match("GET", path)


def test_a_method_the_route_does_not_take_is_405_naming_those_it_does():
    with pytest.raises(MethodNotAllowed) as raised:
        TABLE.match("GET", "/v2/models/m/infer")
    assert raised.value.valid_methods == ["POST"]
    with pytest.raises(MethodNotAllowed) as raised:
        TABLE.match("PUT", "/models")
    assert raised.value.valid_methods == ["GET", "HEAD", "POST"]


def test_head_is_served_by_get():
    assert TABLE.match("HEAD", "/models").route.method == "GET"


@pytest.mark.parametrize("method, path", [("GET", "/v1/models/m:predict"), ("POST", "/v1/models/m"),
                                          ("POST", "/v1/models/m:explain"), ("GET", "/v1/nothing"),
                                          ("POST", "/v1/models/a:b:predict")])
def test_tf_serving_misses_are_malformed_requests(method, path):
    with pytest.raises(InvalidRequest, match=f"Malformed request: {method} {path}"):
        TABLE.match(method, path)


def serve(dispatcher: Dispatcher, method: str, path: str, body: bytes = b"", headers=None, oversize=None):
    return dispatcher.serve(Request(method, path, "", headers or {}, body, oversize))


def test_the_pipeline_renders_every_failure_one_way():
    def fails(request):
        raise ModelNotFound(f"model '{request.params['name']}' is not loaded")

    def crashes(request):
        raise KeyError("bug")

    dispatcher = Dispatcher(Routes([Route("GET", "/m/{name}", fails, "metadata", {}), Route("GET", "/crash", crashes, "metadata", {}),
                                    Route("GET", "/v1/models/{name}", fails, "metadata", {})], [MOUNT]), 100)
    answer = serve(dispatcher, "GET", "/m/x")
    assert (answer.status, orjson.loads(answer.body)) == (404, {"error": "model 'x' is not loaded"})
    assert answer.headers["Content-Type"] == "application/json"
    answer = serve(dispatcher, "GET", "/crash")
    assert answer.status == 500 and "KeyError" in orjson.loads(answer.body)["error"]
    answer = serve(dispatcher, "DELETE", "/m/x")
    assert answer.status == 405 and answer.headers["Allow"] == "GET, HEAD"
    assert "does not take DELETE" in orjson.loads(answer.body)["error"]
    answer = serve(dispatcher, "GET", "/elsewhere")
    assert answer.status == 404 and orjson.loads(answer.body) == {"error": "no endpoint GET /elsewhere; see the README for the API"}
    answer = serve(dispatcher, "GET", "/v1/models/x")  # TF Serving's own spelling of the error document
    assert answer.status == 404 and orjson.loads(answer.body) == {"error": "model 'x' is not loaded"}


def test_one_body_limit_for_every_route():
    dispatcher = Dispatcher(Routes([Route("POST", "/a", handler, "metadata", {}), Route("POST", "/v1/models/{name}:predict", handler, "metadata", {})],
                                   [MOUNT]), 100)
    for path in ("/a", "/v1/models/m:predict"):
        answer = serve(dispatcher, "POST", path, oversize=101)
        assert answer.status == 413 and "the body is 101 bytes; the limit is 100" in orjson.loads(answer.body)["error"]
        answer = serve(dispatcher, "POST", path, oversize=0)  # a chunked body: its length is unknown
        assert answer.status == 413 and "larger than 100 bytes" in orjson.loads(answer.body)["error"]
    assert serve(dispatcher, "GET", "/nope", oversize=101).status == 404  # routing first


def test_the_request_id_is_echoed_or_made():
    dispatcher = Dispatcher(Routes([Route("GET", "/a", handler, "metadata", {})]), 100)
    assert serve(dispatcher, "GET", "/a", headers={"x-request-id": "abc"}).headers["X-Request-Id"] == "abc"
    made = {serve(dispatcher, "GET", path).headers["X-Request-Id"] for path in ("/a", "/a", "/nope")}
    assert len(made) == 3 and all(len(value) == 32 for value in made)


def test_the_wsgi_face_serves_the_same_pipeline(app):
    client = app.test_client()
    answer = client.get("/v2/models/nobody/ready")
    assert answer.status_code == 404 and "unknown model" in answer.json["error"] and answer.headers["X-Request-Id"]
    answer = client.post("/models", data=b"x" * (7 << 20))
    assert answer.status_code == 413 and "SAGEMAKER_MAX_PAYLOAD_IN_MB" in answer.json["error"]
    assert client.put("/ping").headers["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("raw, path, query", [
    (b"/v2/models/a%20b/infer", "/v2/models/a b/infer", ""),
    (b"/models?limit=2&next_page_token=x", "/models", "limit=2&next_page_token=x"),
    (b"/v2/models/%C3%A9", "/v2/models/\u00e9", ""),
    ("/v2/models/\u00e9".encode(), "/v2/models/\u00e9", ""),
    (b"/v2/models/%2E%2E/load", "/v2/models/../load", ""),
    (b"/v2/models/%ff", "/v2/models/\ufffd", ""),
    (b"http://host:8080/models?limit=1", "/models", "limit=1"),  # absolute-form
])
def test_request_targets_are_percent_decoded_as_utf8(raw, path, query):
    assert request_path(raw) == (path, query)


def test_a_mount_without_a_miss_keeps_the_tables_404():
    routes = Routes([Route("GET", "/x/a", handler, "metadata", {})], [Mount("/x/", lambda message: b"!" + message.encode())])
    with pytest.raises(NotFound):
        routes.match("GET", "/x/b")
    assert routes.error_body("/x/b")("m") == b"!m"
