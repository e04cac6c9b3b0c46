"""`GET /metrics` in Prometheus' text format. Triton's metric names where they apply (so Triton
dashboards work), labelled by model and version, plus the cache's own. Everything is read from the
registry at scrape time: serving a request costs nothing extra."""

from flask import Blueprint, Flask, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from container import resources
from container.models.registry import Registry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PER_VERSION = (
    # (name, help, value from a version's Statistics)
    ("nv_inference_request_success", "Number of successful inference requests", lambda s: s.success.count),
    ("nv_inference_request_failure", "Number of failed inference requests", lambda s: s.fail.count),
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
)


class ServerCollector:
    def __init__(self, registry: Registry):
        self.registry = registry

    def collect(self):
        yield from self._memory()
        yield from self._lifecycle()

    def triton_counters(self) -> str:
        """The per-version counters in the text format, written here because prometheus-client renames
        every counter to `…_total`, and Triton's dashboards query Triton's names."""
        lines = []
        for name, documentation, value in _PER_VERSION:
            lines += [f"# HELP {name} {documentation}", f"# TYPE {name} counter"]
            for model in self.registry.ready():
                for version, statistics in sorted(model.statistics.items()):
                    lines.append(f'{name}{{model="{_escape(model.name)}",version="{version}"}} {value(statistics)}')
        return "\n".join(lines) + "\n"

    def _memory(self):
        cache = self.registry.cache
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "Host memory in bytes", value=resources.memory_limit())
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "Host memory in use in bytes", value=resources.memory_used())
        gpus = resources.gpu_usage()
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU memory in bytes", labels=["gpu_uuid"])
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU memory in use in bytes", labels=["gpu_uuid"])
        for uuid, (gpu_total, gpu_used) in gpus.items():
            total.add_metric([uuid], gpu_total)
            used.add_metric([uuid], gpu_used)
        yield total
        yield used
        budget = GaugeMetricFamily("serve_memory_budget_bytes", "Memory budget for models per device", labels=["device"])
        accounted = GaugeMetricFamily("serve_memory_accounted_bytes", "Memory accounted to loaded models per device", labels=["device"])
        for device, limit in cache.budgets.items():
            budget.add_metric([device], limit)
            accounted.add_metric([device], cache.used(device))
        yield budget
        yield accounted
        per_model = GaugeMetricFamily("serve_model_memory_bytes", "Memory accounted to each model", labels=["model", "device"])
        depth = GaugeMetricFamily("serve_queue_depth", "Requests waiting in the model's scheduler", labels=["model"])
        sequences = GaugeMetricFamily("serve_sequences_active", "Sequences holding state", labels=["model"])
        for model in self.registry.ready():
            for device, size in cache.size_of(model).items():
                per_model.add_metric([model.name, device], size)
            depth.add_metric([model.name], model.scheduler.queue_depth())
            sequences.add_metric([model.name], model.scheduler.sequences_active())
        yield per_model
        yield depth
        yield sequences

    def _lifecycle(self):
        counters = self.registry.counters
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
        yield GaugeMetricFamily("serve_models_loaded", "Models ready to serve", value=len(self.registry.ready()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def register_metrics_endpoint(app: Flask, registry: Registry) -> None:
    collector = ServerCollector(registry)
    metrics = CollectorRegistry(auto_describe=False)
    metrics.register(collector)
    api = Blueprint("metrics", __name__)

    @api.get("/metrics")
    def scrape():
        return Response(collector.triton_counters().encode() + generate_latest(metrics), 200, content_type=CONTENT_TYPE)

    app.register_blueprint(api)
