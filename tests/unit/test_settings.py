import re
from dataclasses import fields
from pathlib import Path

import pytest

from container import resources
from container.settings import Settings, SettingsError, configuration_table, parse_size, unused_variables

CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_defaults():
    settings = Settings.from_env({})
    assert settings.port == 8080 and settings.multi_model and settings.model_root == "/opt/ml/models"
    assert settings.eviction == "lru" and settings.max_payload_bytes == 6 << 20 and settings.load_models == ()
    assert settings.memory_limit == int(resources.memory_limit() * 0.7)


def test_single_model_mode_defaults_to_opt_ml_model():
    assert Settings.from_env({"SAGEMAKER_MULTI_MODEL": "false"}).model_root == "/opt/ml/model"
    assert Settings.from_env({"SAGEMAKER_MULTI_MODEL": "false", "SERVE_MODEL_ROOT": "/m"}).model_root == "/m"


@pytest.mark.parametrize("filled, env, multi_model, root", [
    # A SageMaker single-model endpoint: the model extracted into /opt/ml/model, no variable.
    (["model/model.pt"], {}, False, "model"),
    # A multi-model endpoint: SageMaker sets the variable; /opt/ml/model plays no part.
    (["model/model.pt"], {"SAGEMAKER_MULTI_MODEL": "true"}, True, "models"),
    # `docker run -v models:/opt/ml/models`, with /opt/ml/model absent or empty.
    (["models/a/model.pt"], {}, True, "models"),
    (["models/a/model.pt", "model/"], {}, True, "models"),
    # A model root of one's own is a multi-model root unless told otherwise.
    (["model/model.pt"], {"SERVE_MODEL_ROOT": "/m"}, True, "/m"),
    (["model/model.pt"], {"SERVE_MODEL_ROOT": "/m", "SAGEMAKER_MULTI_MODEL": "false"}, False, "/m"),
    (["models/a/model.pt"], {"SAGEMAKER_MULTI_MODEL": "false"}, False, "model"),
])
def test_mode_follows_what_sagemaker_passes(tmp_path, filled, env, multi_model, root):
    for path in filled:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        if not path.endswith("/"):
            (tmp_path / path).write_bytes(b"weights")
        else:
            (tmp_path / path).mkdir(exist_ok=True)
    settings = Settings.from_env({"SAGEMAKER_BASE_DIR": str(tmp_path), **env})
    assert settings.multi_model is multi_model
    assert settings.model_root == (root if root.startswith("/") else str(tmp_path / root))


def test_values_from_the_environment():
    settings = Settings.from_env({
        "SAGEMAKER_BIND_TO_PORT": "9000", "SERVE_MEMORY_LIMIT": "512MiB", "SERVE_EVICTION": "NONE",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0.5", "SERVE_LOAD_MODELS": " a, b ,", "SERVE_LOG_LEVEL": "debug",
    })
    assert settings.port == 9000 and settings.memory_limit == 512 << 20 and settings.eviction == "none"
    assert settings.max_payload_bytes == 1 << 19 and settings.load_models == ("a", "b") and settings.log_level == "DEBUG"


@pytest.mark.parametrize("text, expected", [
    ("1024", 1024), ("1.5KiB", 1536), ("2 MiB", 2 << 20), ("1GiB", 1 << 30), ("50%", 500), ("100%", 1000),
])
def test_parse_size(text, expected):
    assert parse_size(text, 1000) == expected


@pytest.mark.parametrize("text", ["", "lots", "5MB", "-1", "0%", "101%", "abc%"])
def test_parse_size_refuses(text):
    with pytest.raises(SettingsError):
        parse_size(text, 1000)


@pytest.mark.parametrize("env, named", [
    ({"SERVE_MEMORY_LIMIT": "lots"}, "SERVE_MEMORY_LIMIT"),
    ({"SERVE_GPU_MEMORY_LIMIT": "200%"}, "SERVE_GPU_MEMORY_LIMIT"),
    ({"SERVE_EVICTION": "fifo"}, "SERVE_EVICTION"),
    ({"SAGEMAKER_MULTI_MODEL": "2"}, "SAGEMAKER_MULTI_MODEL"),
    ({"SAGEMAKER_BIND_TO_PORT": "http"}, "SAGEMAKER_BIND_TO_PORT"),
    ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "SAGEMAKER_BIND_TO_PORT='70000': expected a TCP port"),
    ({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "0"}, "SAGEMAKER_MAX_PAYLOAD_IN_MB"),
    ({"SERVE_REPOSITORY_POLL_SECONDS": "soon"}, "SERVE_REPOSITORY_POLL_SECONDS"),
    ({"SERVE_REPOSITORY_POLL_SECONDS": "5", "SERVE_MODEL_ROOT": "s3://bucket/models"}, "local model root"),
    ({"SERVE_REPOSITORY_POLL_SECONDS": "5", "SAGEMAKER_MULTI_MODEL": "false"}, "multi-model server only"),
    ({"SAGEMAKER_SAFE_PORT_RANGE": "23000"}, "SAGEMAKER_SAFE_PORT_RANGE='23000': expected a range"),
    ({"SAGEMAKER_SAFE_PORT_RANGE": "23999-23000"}, "SAGEMAKER_SAFE_PORT_RANGE"),
    ({"SAGEMAKER_SAFE_PORT_RANGE": "0-99999"}, "SAGEMAKER_SAFE_PORT_RANGE"),
    ({"SAGEMAKER_SAFE_PORT_RANGE": "low-high"}, "SAGEMAKER_SAFE_PORT_RANGE"),
    ({"SAGEMAKER_SAFE_PORT_RANGE": "23000-23999", "SERVE_GRPC_PORT": "8001"},
     r"SERVE_GRPC_PORT='8001' is outside SAGEMAKER_SAFE_PORT_RANGE \(23000-23999\)"),
    ({"SAGEMAKER_SAFE_PORT_RANGE": "23000-23999", "SERVE_METRICS_PORT": "24000"}, "SERVE_METRICS_PORT='24000' is outside"),
    ({"SERVE_METRICS_PORT": "8080"}, "SERVE_METRICS_PORT=8080 is SAGEMAKER_BIND_TO_PORT's port too"),
    ({"SERVE_GRPC_PORT": "9000", "SAGEMAKER_BIND_TO_PORT": "9000"}, "SERVE_GRPC_PORT=9000 is SAGEMAKER_BIND_TO_PORT's"),
    ({"SERVE_METRICS_PORT": "8001"}, "SERVE_METRICS_PORT=8001 is SERVE_GRPC_PORT's port too"),
])
def test_bad_values_name_the_variable(env, named):
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(env)


def test_on_sagemaker_the_server_listens_within_the_safe_port_range_alone():
    """SageMaker gives a container SAGEMAKER_BIND_TO_PORT and a range of ports it may listen on besides (the
    containers of an inference pipeline share the host's), and sends it nothing but HTTP: gRPC is off there
    unless asked for, and what is asked for lies within the range, as Triton's SageMaker mode holds it."""
    sagemaker = {"SAGEMAKER_SAFE_PORT_RANGE": "23000-23999"}
    settings = Settings.from_env(sagemaker)
    assert (settings.safe_port_range, settings.grpc_port, settings.metrics_port) == ((23000, 23999), None, None)
    settings = Settings.from_env({**sagemaker, "SERVE_GRPC_PORT": "23000", "SERVE_METRICS_PORT": "23999"})
    assert (settings.grpc_port, settings.metrics_port) == (23000, 23999)
    assert Settings.from_env({**sagemaker, "SERVE_GRPC_PORT": "off"}).grpc_port is None
    settings = Settings.from_env({})
    assert (settings.safe_port_range, settings.grpc_port) == (None, 8001)


def test_the_configuration_page_is_the_table_the_settings_declare():
    page = CONFIGURATION.read_text()
    table = page.split("<!-- generated: python -m container.settings -->\n")[1].split("\n<!-- end generated -->")[0]
    assert table == configuration_table()
    assert {f.metadata["env"] for f in fields(Settings)} == set(re.findall(r"^\| `([A-Z0-9_]+)` \|", page, re.MULTILINE))


def test_relaxations_are_off_by_default_and_named_when_on():
    assert Settings.from_env({}).relaxations() == {}
    settings = Settings.from_env({"SERVE_ALLOW_CLIENT_SHM": "true", "SERVE_ALLOW_MODEL_FILES": "yes",
                                  "SERVE_S3_ROOTS": "s3://models/repo, s3://other", "SERVE_MODEL_ROOT": "s3://root/m",
                                  "SERVE_RESPONSE_CACHE_SIZE": "1MiB"})
    assert settings.s3_roots == ("s3://models/repo/", "s3://other/", "s3://root/m/")
    assert settings.relaxations() == {"SERVE_ALLOW_CLIENT_SHM": True, "SERVE_ALLOW_MODEL_FILES": True,
                                      "SERVE_S3_ROOTS": "s3://models/repo/,s3://other/",  # the model root is no relaxation
                                      "SERVE_RESPONSE_CACHE_SIZE": 1 << 20}


@pytest.mark.parametrize("text", ["s3:/x", "http://bucket/x", "s3://", "s3://b/../c"])
def test_s3_roots_must_be_s3_urls(text):
    with pytest.raises(SettingsError, match="SERVE_S3_ROOTS"):
        Settings.from_env({"SERVE_S3_ROOTS": text})


def test_restricted_api_takes_tritons_grammar():
    (first, second) = Settings.from_env({"SERVE_RESTRICTED_API": "model-repository,shared-memory:Admin-Key=a=b; statistics:k=v"}).restricted_api
    assert first.groups == {"model-repository", "shared-memory"} and first.header == "admin-key" and first.value == "a=b"
    assert second.groups == {"statistics"} and (second.header, second.value) == ("k", "v")


def test_restricted_api_takes_each_of_tritons_nine_groups():
    text = "health,metadata,inference,shared-memory,model-config,model-repository,statistics,trace,logging:k=v"
    assert len(Settings.from_env({"SERVE_RESTRICTED_API": text}).restricted_api[0].groups) == 9


@pytest.mark.parametrize("text", ["model-repository", "model-repository:key", "model-repository:=v", "tracing:k=v",
                                  ":k=v", "statistics:k=v;statistics:j=w"])
def test_restricted_api_refuses_what_it_cannot_enforce(text):
    with pytest.raises(SettingsError, match="SERVE_RESTRICTED_API"):
        Settings.from_env({"SERVE_RESTRICTED_API": text})


def test_a_refused_restriction_never_shows_its_value():
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"SERVE_RESTRICTED_API": "tracing:key=the-secret-value"})
    assert "the-secret-value" not in str(refused.value) and "tracing" in str(refused.value)


@pytest.mark.parametrize("cores, expected", [(1, 0), (2, 2), (16, 16), (96, 16)])
def test_http_front_ends_default_to_one_per_core_and_none_on_one(monkeypatch, cores, expected):
    monkeypatch.setattr(resources, "cpu_quota", lambda: cores)
    assert Settings.from_env({}).http_workers == expected
    assert Settings.from_env({"SERVE_HTTP_WORKERS": "3"}).http_workers == 3
    assert Settings.from_env({"SERVE_HTTP_WORKERS": "0"}).http_workers == 0


@pytest.mark.parametrize("cores, expected", [(1, 1000), (2, 300), (16, 300)])
def test_the_loop_runs_longer_executions_itself_on_one_core(monkeypatch, cores, expected):
    monkeypatch.setattr(resources, "cpu_quota", lambda: cores)
    assert Settings.from_env({}).inline_below_us == expected
    assert Settings.from_env({"SERVE_INLINE_BELOW_US": "0"}).inline_below_us == 0
    assert Settings.from_env({"SERVE_INLINE_BELOW_US": "2500"}).inline_below_us == 2500


@pytest.mark.parametrize("text", ["-1", "many", "1.5", "300us"])
def test_an_inline_threshold_that_is_not_auto_or_whole_microseconds_stops_the_server(text):
    with pytest.raises(SettingsError, match="SERVE_INLINE_BELOW_US"):
        Settings.from_env({"SERVE_INLINE_BELOW_US": text})


@pytest.mark.parametrize("text", ["-1", "65", "many", "1.5"])
def test_http_front_ends_outside_0_to_64_stop_the_server(text):
    with pytest.raises(SettingsError, match="SERVE_HTTP_WORKERS"):
        Settings.from_env({"SERVE_HTTP_WORKERS": text})


@pytest.mark.parametrize("env, gpus, workers", [
    ({}, 0, 1),  # a multi-model endpoint: one worker a model
    ({"SAGEMAKER_MULTI_MODEL": "false"}, 0, resources.cpu_quota()),  # a single-model endpoint: one per core
    ({"SAGEMAKER_MULTI_MODEL": "false"}, 4, 4),  # or one per GPU
    ({"SAGEMAKER_MULTI_MODEL": "false", "SAGEMAKER_TS_MIN_WORKERS": "3"}, 0, 3),
    ({"SAGEMAKER_TS_MIN_WORKERS": "3"}, 0, 1),  # the toolkit's single-model setting is not a multi-model one
    ({"SAGEMAKER_MODEL_SERVER_WORKERS": "5", "SAGEMAKER_TS_MIN_WORKERS": "3", "SAGEMAKER_MULTI_MODEL": "false"}, 0, 5),
    ({"SAGEMAKER_MODEL_SERVER_WORKERS": "2"}, 0, 2),
])
def test_handler_models_get_as_many_workers_as_sagemakers_container_gives_them(env, gpus, workers):
    assert Settings.from_env(env).handler_workers(gpus) == workers


@pytest.mark.parametrize("name", ["SAGEMAKER_MODEL_SERVER_WORKERS", "SAGEMAKER_TS_MIN_WORKERS", "SAGEMAKER_TS_RESPONSE_TIMEOUT"])
def test_a_worker_count_or_timeout_that_is_not_a_positive_number_is_refused_by_name(name):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: "0"})


@pytest.mark.parametrize("env, seconds", [
    ({}, 60),  # SAGEMAKER_MODEL_SERVER_TIMEOUT's default: the toolkit's default_response_timeout for TorchServe
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "300"}, 300),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "300", "SAGEMAKER_TS_RESPONSE_TIMEOUT": "7"}, 7),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "0"}, None),
])
def test_a_handler_worker_has_the_response_timeout_sagemakers_container_gives_it(env, seconds):
    assert Settings.from_env(env).handler_timeout == seconds


def test_the_repository_is_polled_only_when_asked():
    assert Settings.from_env({}).repository_poll_seconds == 0
    assert Settings.from_env({"SERVE_REPOSITORY_POLL_SECONDS": "2.5"}).repository_poll_seconds == 2.5


def test_a_variable_that_changes_nothing_is_named_with_what_was_likely_meant():
    every_setting = {f.metadata["env"]: "x" for f in fields(Settings)}
    kubernetes = {"SERVE_SERVICE_HOST": "10.0.0.1", "SERVE_SERVICE_PORT": "80", "SERVE_SERVICE_PORT_HTTP": "80",
                  "SERVE_PORT": "tcp://10.0.0.1:80", "SERVE_PORT_80_TCP_ADDR": "10.0.0.1"}  # a Service named `serve`
    unused = unused_variables({**every_setting, **kubernetes, "SAGEMAKER_REGION": "us-east-1", "PATH": "/bin",
                               "SERVE_HTTP_WORKER": "4", "SERVE_MEMORY_LIMT": "1GiB", "SERVE_TOKEN": "a-secret-value",
                               "SAGEMAKER_TS_BATCH_SIZE": "8", "SAGEMAKER_TS_MAX_BATCH_DELAY": "100"})
    assert set(unused) == {"SERVE_HTTP_WORKER", "SERVE_MEMORY_LIMT", "SERVE_TOKEN", "SAGEMAKER_TS_BATCH_SIZE",
                           "SAGEMAKER_TS_MAX_BATCH_DELAY"}
    assert "did you mean SERVE_HTTP_WORKERS?" in unused["SERVE_HTTP_WORKER"]
    assert "did you mean SERVE_MEMORY_LIMIT?" in unused["SERVE_MEMORY_LIMT"]
    assert "did you mean" not in unused["SERVE_TOKEN"] and "a-secret-value" not in "".join(unused.values())
    assert "one request at a time" in unused["SAGEMAKER_TS_BATCH_SIZE"]
