"""`GET /metrics` in Prometheus' text format. Triton's metric names where they apply (so Triton
dashboards work), labelled by model and version, plus the cache's own. Everything is read from the
registry at scrape time: serving a request costs nothing extra. Python models' own metric families
(`pb_utils.MetricFamily`) follow Triton's, as their instances last reported them."""

import psutil
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from container import resources
from container.api.openapi import METRICS, operation
from container.api.pipeline import Response
from container.api.routing import Route
from container.core import Core

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PER_VERSION = (
    # (name, help, value from a version's Statistics)
    ("nv_inference_request_success", "Number of successful inference requests", lambda s: s.success.count),
    ("nv_inference_request_failure", "Number of failed inference requests", lambda s: s.failures),  # by reason
    ("nv_inference_count", "Number of inferences performed (batch items)", lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed", lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative successful request duration in microseconds",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us", "Cumulative time requests spent queued in microseconds",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative compute output duration in microseconds",
     lambda s: s.compute_output.ns // 1000),
    ("nv_cache_num_hits_per_model", "Number of requests answered from the response cache", lambda s: s.cache_hit.count),
    ("nv_cache_num_misses_per_model", "Number of requests the response cache did not hold", lambda s: s.cache_miss.count),
    ("nv_cache_hit_duration_per_model", "Cumulative response cache look-up duration of hits in microseconds",
     lambda s: s.cache_hit.ns // 1000),
    ("nv_cache_miss_duration_per_model", "Cumulative response cache look-up and insertion duration of misses in "
     "microseconds", lambda s: s.cache_miss.ns // 1000),
)


class ServerCollector:
    def __init__(self, core: Core, gpus, idle_bytes: int):
        """`gpus`: backends.gpus.Gpus; `idle_bytes`: the process's own pages before any model."""
        self.core = core
        self.gpus = gpus
        self.idle_bytes = idle_bytes

    def collect(self):
        yield from self._memory()
        yield from self._lifecycle()
        yield self._on_loop()

    def triton_counters(self) -> str:
        """The per-version counters in the text format, written here because prometheus-client renames
        every counter to `…_total`, and Triton's dashboards query Triton's names."""
        lines, caching = [], self.core.response_cache is not None
        for name, documentation, value in _PER_VERSION:
            lines += [f"# HELP {name} {documentation}", f"# TYPE {name} counter"]
            for model, version, statistics in self.core.stats():
                if name.startswith("nv_cache_") and not (caching and model.caches):  # as Triton: only where it caches
                    continue
                counted, labels = value(statistics), f'model="{_escape(model.name)}"'
                if isinstance(counted, dict):  # one line a reason, as Triton labels them
                    lines += [f'{name}{{{labels},reason="{reason}",version="{version}"}} {n}' for reason, n in counted.items()]
                else:
                    lines.append(f'{name}{{{labels},version="{version}"}} {counted}')
        return "\n".join(lines) + "\n"

    def custom(self) -> str:
        """Python models' own metric families (`pb_utils.MetricFamily`), named as their code names them.
        A family several instances report is one family: counters and histograms add up, a gauge shows
        the value reported last."""
        families: dict[str, tuple[str, str, dict]] = {}
        for reported in self.core.custom_metrics():
            for name, documentation, kind, metrics in reported:
                _, _, series = families.setdefault(name, (documentation, kind, {}))
                for labels, value, buckets, counts in metrics:
                    key = tuple(sorted(labels.items()))
                    before = series.get(key)
                    if before is not None and kind != "gauge":
                        value, counts = before[0] + value, [a + b for a, b in zip(before[2] or [], counts or [], strict=True)] or None
                    series[key] = (value, buckets, counts)
        lines = []
        for name, (documentation, kind, series) in families.items():
            lines += [f"# HELP {name} {_escape_help(documentation)}", f"# TYPE {name} {kind}"]
            for key, (value, buckets, counts) in series.items():
                lines += _series(name, dict(key), value, buckets, counts)
        return "".join(line + "\n" for line in lines)

    def _memory(self):
        # the machine's busy share of its CPUs since the last scrape (0 at the first), as Triton's reads /proc/stat
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=psutil.cpu_percent() / 100)
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "Host memory in bytes", value=resources.memory_limit())
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "Host memory in use in bytes", value=resources.memory_used())
        gpus = self.gpus.usage()
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU memory in bytes", labels=["gpu_uuid"])
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU memory in use in bytes", labels=["gpu_uuid"])
        for uuid, (gpu_total, gpu_used) in gpus.items():
            total.add_metric([uuid], gpu_total)
            used.add_metric([uuid], gpu_used)
        yield total
        yield used
        budget = GaugeMetricFamily("serve_memory_budget_bytes", "Memory budget for models per device", labels=["device"])
        accounted = GaugeMetricFamily("serve_memory_accounted_bytes", "Memory accounted to loaded models per device", labels=["device"])
        measured = GaugeMetricFamily("serve_memory_measured_bytes", "Memory the models really hold per device: the "
                                     "server's own pages above its idle start plus its handler workers' (cpu), torch's "
                                     "reservations (cuda)", labels=["device"])
        server = GaugeMetricFamily("serve_memory_server_bytes", "Memory the server's own parts took after its idle "
                                   "start, no model's, which lowers the budget where the container's RAM bounds it: "
                                   "runtimes prepared on demand, the fork server of handler workers, the front-ends "
                                   "beyond what was set aside for them, the response cache's responses",
                                   labels=["device", "part"])
        parts = self.core.server_memory()
        held = self._held(parts["runtimes"]["cpu"] + parts.get("response_cache", {}).get("cpu", 0))
        for device, (limit, used) in self.core.memory().items():
            budget.add_metric([device], limit)
            accounted.add_metric([device], used)
            measured.add_metric([device], held.get(device, 0))
        for part, sizes in parts.items():
            for device, size in sizes.items():
                server.add_metric([device, part], size)
        yield budget
        yield accounted
        yield measured
        yield server
        per_model = GaugeMetricFamily("serve_model_memory_bytes", "Memory accounted to each model", labels=["model", "device"])
        per_kind = GaugeMetricFamily("serve_model_measured_bytes", "What each model's accounting rests on: its weights, "
                                     "the growth its load measured, its activation peak", labels=["model", "device", "kind"])
        depth = GaugeMetricFamily("serve_queue_depth", "Requests waiting in the model's scheduler", labels=["model"])
        # Triton's name for it, as autoscalers set up for Triton read it. A model's versions share one scheduler
        # here (each has its own on Triton), so a model's waiting requests count on its latest version.
        pending = GaugeMetricFamily("nv_inference_pending_request_count", "Instantaneous number of pending requests "
                                    "awaiting execution per-model", labels=["model", "version"])
        sequences = GaugeMetricFamily("serve_sequences_active", "Sequences holding state", labels=["model"])
        for model in self.core.ready():
            for device, size in self.core.model_memory(model).items():
                per_model.add_metric([model.name, device], size)
            for kind, sizes in self.core.measured(model).items():
                for device, size in sizes.items():
                    per_kind.add_metric([model.name, device, kind], size)
            waiting, active = self.core.queue(model)
            depth.add_metric([model.name], waiting)
            for version in model.versions:
                pending.add_metric([model.name, str(version)], waiting if version == model.versions[-1] else 0)
            sequences.add_metric([model.name], active)
        yield per_model
        yield per_kind
        yield depth
        yield pending
        yield sequences

    def _held(self, own: int) -> dict[str, int]:
        """`own`: what the server's parts in this process hold since the idle start (runtimes, the
        response cache), no model's."""
        held = {"cpu": max(psutil.Process().memory_full_info().uss - self.idle_bytes - own, 0)}
        for device in self.gpus.devices:
            held[device] = self.gpus.reserved(device)
        return self.core.held_memory(held)

    def _lifecycle(self):
        counters = self.core.counters
        loads = CounterMetricFamily("serve_model_loads", "Model loads", labels=["outcome"])
        loads.add_metric(["success"], counters.loads)
        loads.add_metric(["failure"], counters.load_failures)
        yield loads
        yield CounterMetricFamily("serve_model_load_seconds", "Time spent loading models", value=counters.load_seconds)
        yield CounterMetricFamily("serve_model_evictions", "Idle models evicted to make room", value=counters.evictions)
        yield CounterMetricFamily("serve_cache_hits", "Requests for a target model already loaded", value=counters.hits)
        yield CounterMetricFamily("serve_cache_misses", "Requests whose target model had to be loaded", value=counters.misses)
        yield CounterMetricFamily("serve_insufficient_memory", "Loads and executions answered 507", value=counters.insufficient_memory)
        yield CounterMetricFamily("serve_memory_recoveries", "Device out-of-memory errors met by freeing room and trying again",
                                  value=counters.recoveries)
        yield GaugeMetricFamily("serve_models_loaded", "Models ready to serve", value=len(self.core.ready()))
        responses = self.core.response_cache
        if responses is not None:
            yield GaugeMetricFamily("serve_response_cache_bytes", "Bytes the response cache's responses hold",
                                    value=responses.bytes)
            yield GaugeMetricFamily("serve_response_cache_budget_bytes", "The response cache's size (SERVE_RESPONSE_CACHE_SIZE)",
                                    value=responses.most_bytes)
            yield CounterMetricFamily("serve_response_cache_evictions", "Responses the response cache dropped to make room",
                                      value=responses.evictions)
        yield from self._downloads()

    def _on_loop(self):
        """Where executions ran, for tuning SERVE_INLINE_BELOW_US: those the event loop ran itself."""
        on_loop = CounterMetricFamily("serve_inference_exec_on_loop", "Model executions run on the event loop rather "
                                      "than an instance thread (SERVE_INLINE_BELOW_US)", labels=["model", "version"])
        for model, version, statistics in self.core.stats():
            on_loop.add_metric([model.name, str(version)], statistics.loop_execution_count)
        return on_loop

    def _downloads(self):
        downloads = self.core.download_cache()
        if downloads is None:
            return
        counters = downloads.counters
        yield GaugeMetricFamily("serve_download_cache_bytes", "Bytes the S3 download cache holds", value=downloads.used)
        yield GaugeMetricFamily("serve_download_cache_budget_bytes", "The download cache's budget", value=downloads.budget)
        yield GaugeMetricFamily("serve_downloads_in_progress", "S3 downloads under way", value=downloads.in_progress)
        yield CounterMetricFamily("serve_download_cache_hits", "Loads from S3 served by a cached copy", value=counters.hits)
        yield CounterMetricFamily("serve_download_cache_misses", "Loads from S3 that needed a download", value=counters.misses)
        yield CounterMetricFamily("serve_downloads", "Completed S3 downloads", value=counters.downloads)
        yield CounterMetricFamily("serve_download_bytes", "Bytes downloaded from S3", value=counters.bytes)
        yield CounterMetricFamily("serve_download_seconds", "Time spent downloading from S3", value=counters.seconds)
        yield CounterMetricFamily("serve_download_cache_evictions", "Unused downloads removed to make room", value=counters.evictions)


def _series(name: str, labels: dict, value: float, buckets, counts) -> list[str]:
    if buckets is None:
        return [f"{name}{_labels(labels)} {value}"]
    lines, total = [], 0
    for edge, count in zip([*buckets, "+Inf"], counts, strict=True):
        total += count
        lines.append(f"{name}_bucket{_labels({**labels, 'le': str(edge)})} {total}")
    return [*lines, f"{name}_sum{_labels(labels)} {value}", f"{name}_count{_labels(labels)} {total}"]


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_routes(core: Core, gpus, idle_bytes: int) -> list[Route]:
    collector = ServerCollector(core, gpus, idle_bytes)
    metrics = CollectorRegistry(auto_describe=False)
    metrics.register(collector)

    def scrape(request) -> Response:
        text = collector.triton_counters() + collector.custom()
        return Response(text.encode() + generate_latest(metrics), CONTENT_TYPE)

    return [Route("GET", "/metrics", scrape, "statistics",
                  operation("Prometheus metrics (Triton's names, and the server's own)", METRICS,
                            {"content": {"text/plain": {"schema": {"type": "string"}}}}, errors=()))]
