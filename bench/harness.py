"""What every scenario needs: the real server on a free port, wrk driving it with a fixed request
body, and in-process torch as the reference, with the same torch thread count as the server's."""

import fcntl
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
# this process's cores before pin_apart moves it: pinning a second server must see all of them again
CORES = sorted(os.sched_getaffinity(0))


@dataclass
class Load:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    client_cpu: float = 0.0  # the share of one core wrk itself used: well below 1 means it was not the limit


# The cores a server runs on beside the load generator: it starts on them, as a container given that
# many CPUs would, so that what it sizes from its CPU quota (torch's threads, `auto` settings) fits.
SERVER_CORES = CORES[: len(CORES) // 2] or CORES


class Server:
    def __init__(self, model_root: Path, cores=SERVER_CORES, **env):
        self.model_root = model_root
        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_url = f"http://127.0.0.1:{self.grpc_port}"
        self.metrics_url = self.url + "/metrics"  # as Triton's (bench/triton.py), which serves it on a port of its own
        environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                       "SAGEMAKER_BIND_TO_PORT": str(self.port), "SERVE_GRPC_PORT": str(self.grpc_port), "SERVE_MODEL_ROOT": str(model_root),
                       "SERVE_LOAD_MODELS": "*", "SERVE_LOG_LEVEL": "warning",
                       "SERVE_HTTP_WORKERS": "0",  # what `auto` gives the one server core most scenarios pin it to
                       **env}
        self.log = tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log", delete=False)
        self.process = subprocess.Popen([str(PROJECT / "serve")], cwd=PROJECT, env=environment, start_new_session=True,
                                        stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=starting_on(cores))
        wait_ready(self, Path(self.log.name), grpc=environment["SERVE_GRPC_PORT"].lower() != "off")

    def pin(self) -> None:
        """The server (gunicorn, its worker, the fork server and handler workers) on the first half of
        the cores, this process — the load generator — on the rest, so neither measures the other."""
        pin_apart(self.process.pid)

    def worker_pid(self) -> int:
        """The gunicorn worker: the process that holds the models (the master's main thread started
        only it; the front-ends are children of the thread that keeps them running)."""
        return int(Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()[0])

    def http_front_end_pids(self) -> list[int]:
        return self._pids(b"container.http_frontend")

    def grpc_front_end_pids(self) -> list[int]:
        return self._pids(b"container.grpc_api")

    def _pids(self, module: bytes) -> list[int]:
        return [pid for pid in tree(self.process.pid) if module in Path(f"/proc/{pid}/cmdline").read_bytes()]

    def worker_rss(self) -> int:
        """Resident bytes of the gunicorn worker."""
        for line in Path(f"/proc/{self.worker_pid()}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def metrics(self) -> dict[str, float]:
        """Unlabelled sums of each sample in /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def labelled_metrics(self) -> dict[tuple, float]:
        """(name, sorted labels) → value of each sample in /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> int:
        request = urllib.request.Request(self.url + path, body, headers or {"Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(request, timeout=300).status
        except urllib.error.HTTPError as exc:
            return exc.code

    def delete(self, path: str) -> int:
        request = urllib.request.Request(self.url + path, method="DELETE")
        return urllib.request.urlopen(request, timeout=300).status

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(60)
        self.log.close()
        os.unlink(self.log.name)


def run_together(threads: list, seconds: float, stop, join_timeout: float | None = None) -> int:
    """Starts `threads`, lets them run for `seconds`, sets `stop` (an Event they watch) and waits for each
    for up to `join_timeout` seconds (None: until it ends); returns how many are still running."""
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(join_timeout)
    return sum(thread.is_alive() for thread in threads)


def end_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group a peer server started in, then SIGKILL to what is left after a
    minute; returns once every process of the group has gone (TorchServe's Java outlives its launcher by
    seconds, and must not run into the next measurement)."""
    deadline, signalled = time.monotonic() + 60, signal.SIGTERM
    try:
        os.killpg(process.pid, signalled)
        while True:
            process.poll()  # reaps the leader; the others are reaped by init
            os.killpg(process.pid, 0)  # raises once no process of the group is left
            if time.monotonic() > deadline and signalled is signal.SIGTERM:
                signalled = signal.SIGKILL
                os.killpg(process.pid, signalled)
            time.sleep(0.1)
    except ProcessLookupError:
        pass
    process.wait()


def ratio(value: float, reference: float) -> str:
    """`value / reference` as a table cell; a reference that served nothing (a smoke run's second) has none."""
    return f"{value / reference:.2f}×" if reference else "—"


def inference_counts(url: str, model: str) -> tuple[int, int]:
    """The model's inference and execution counts so far (V2 statistics: this server and Triton have them)."""
    stats = json.load(urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10))["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def executions(url: str, model: str) -> tuple[int, int]:
    """The model's executions so far, and how many of them its event loop ran itself (this server's
    /metrics: `serve_inference_exec_on_loop`)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    counts = {"nv_inference_exec_count": 0, "serve_inference_exec_on_loop": 0}
    for family in text_string_to_metric_families(text):
        if family.name in counts:
            counts[family.name] = int(sum(s.value for s in family.samples if s.labels.get("model") == model))
    return counts["nv_inference_exec_count"], counts["serve_inference_exec_on_loop"]


_PORT_LOCKS = Path(tempfile.gettempdir()) / "serve-ports"
_held: dict[int, int] = {}  # port → the descriptor of its lock file, held while this process lives


def free_port() -> int:
    """A port nothing listens on, handed out once while this process lives, and to no other process
    that asks here meanwhile (each holds a lock file per port it was given; the locks go with the
    process): the system may give a port back twice running, before the server it was for has bound
    it. A server's HTTP and gRPC ports once came out the same; and with the suite's workers and the
    bench's processes starting servers at once, one's gRPC port was another's HTTP port."""
    _PORT_LOCKS.mkdir(exist_ok=True)
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port in _held:
            continue
        lock = os.open(_PORT_LOCKS / str(port), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process was given it
            os.close(lock)
            continue
        _held[port] = lock
        return port


def wait_ready(server, log: Path, grpc: bool = True) -> None:
    """Until `server.url` answers V2 readiness and, with `grpc`, its gRPC port takes connections (the gRPC
    front-ends listen once they reach the model process, which may be after HTTP answers, so a gRPC load
    could start against a closed port); a server that exits or takes two minutes is stopped, and its log's
    end raised."""
    deadline = time.monotonic() + 120
    grpc_address = urllib.parse.urlsplit(server.grpc_url)
    while True:
        try:
            if urllib.request.urlopen(server.url + "/v2/health/ready", timeout=2).status == 200:
                if grpc:
                    socket.create_connection((grpc_address.hostname, grpc_address.port), timeout=2).close()
                return
        except OSError:
            pass
        if time.monotonic() > deadline or server.process.poll() is not None:
            tail = log.read_text()[-3000:]
            server.stop()
            raise RuntimeError(f"{type(server).__name__} did not become ready:\n{tail}")
        time.sleep(0.2)


def starting_on(cores):
    """A `preexec_fn` that starts a process on `cores`."""
    return lambda: os.sched_setaffinity(0, cores)


def pin_apart(pid: int) -> None:
    """The process `pid` and its descendants, every thread of each, on the first half of the cores
    (SERVER_CORES); this process (and the wrk it starts) on the rest. Nothing to do on one core."""
    if len(CORES) < 2:
        return
    pin_to(pid, SERVER_CORES)
    os.sched_setaffinity(0, CORES[len(CORES) // 2:])


def pin_to(pid: int, cores) -> None:
    """The process `pid` and its descendants, every thread of each, on `cores`."""
    for process in tree(pid):
        for thread in Path(f"/proc/{process}/task").iterdir():  # a pid's affinity is its first thread's alone
            os.sched_setaffinity(int(thread.name), cores)


def cpu_seconds(pid: int, descendants: bool = True) -> float:
    """User and system CPU time of `pid` (all of its threads) and, unless told not to, of its live
    descendants."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for process in tree(pid) if descendants else [pid]:
        fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def context_switches(pid: int) -> int:
    """The context switches of `pid`'s threads, voluntary and not: how often the process sleeps or is put
    aside, which costs many times more on some VMs than here."""
    switches = 0
    for thread in Path(f"/proc/{pid}/task").iterdir():  # a pid's status counts its first thread's alone
        for line in (thread / "status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.endswith("ctxt_switches"):
                switches += int(value)
    return switches


def tree(pid: int) -> list[int]:
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").iterdir():
            pending += [int(child) for child in (task / "children").read_text().split()]
    return found


def wrk(url: str, body: bytes = b"", headers: dict[str, str] | None = None, connections: int = 1, seconds: float = 10,
        lua: str = "") -> Load:
    """wrk (C, one event-loop thread) as the load generator; `lua` is appended to its script (a
    `request` function that varies requests, say)."""
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed: apt-get install wrk (make bench does)")
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "request.lua"
        (Path(scratch) / "body").write_bytes(body)
        lines = [f'local f = io.open("{scratch}/body", "rb"); wrk.body = f:read("*all"); f:close()',
                 f'wrk.method = "{"POST" if body else "GET"}"']
        lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in (headers or {}).items()]
        script.write_text("\n".join(lines) + "\n")
        script.write_text(script.read_text() + lua)
        command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script), url]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = _parse(output)
    load.client_cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / (time.perf_counter() - started)
    return load


def h2load(url: str, method: str, message: bytes, connections: int = 1, seconds: float = 10) -> Load:
    """h2load (nghttp2's C load generator) sending one gRPC call after another on each of `connections`
    HTTP/2 connections: `message` is the serialized request, `method` its path (`/package.Service/Method`).
    h2load counts HTTP statuses, not gRPC ones: the scenario checks the server's own counts."""
    if not shutil.which("h2load"):
        raise SystemExit("h2load is not installed: apt-get install nghttp2-client (make bench does)")
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "body").write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)  # gRPC's framing
        command = ["h2load", f"-c{connections}", "-m1", f"-D{max(1, round(seconds))}", "-d", f"{scratch}/body",
                   "-H", "content-type: application/grpc", "-H", "te: trailers", f"--log-file={scratch}/log", url + method]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [line.split("\t") for line in (Path(scratch) / "log").read_text().splitlines()]
    micros = sorted(int(row[2]) for row in rows) or [math.nan]  # none finished: a slow call on a short run
    errors = sum(row[1] != "200" for row in rows) + int(re.search(r"(\d+) failed", output).group(1))
    rate = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", output).group(1))
    load = Load(rate, micros[len(micros) // 2] / 1000, micros[int(len(micros) * 0.99)] / 1000, errors)
    load.client_cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / elapsed
    return load


def _parse(output: str) -> Load:
    def latency(percent: str) -> float:
        value, unit = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE).groups()
        return float(value) * _UNITS[unit]

    errors = sum(int(n) for n in re.findall(r"(?:Non-2xx or 3xx responses|connect|read|write|timeout)\s*:?\s*(\d+)", output))
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    return Load(rate, latency("50"), latency("99"), errors)


def v2_binary_request(name: str, array, output: str = "OUTPUT0") -> tuple[bytes, dict[str, str]]:
    """A V2 infer body with one binary input, asking for `output` in binary, and the header that says
    where its JSON ends."""
    header = json.dumps({"inputs": [{"name": name, "shape": list(array.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": array.nbytes}}],
                         "outputs": [{"name": output, "parameters": {"binary_data": True}}]}).encode()
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def in_process_calls_per_s(module, example, seconds: float = 2.0) -> float:
    """torch on its own, with the thread count the server gives it: calls per second on `example`."""
    import torch

    from container import resources
    from container.backends.torch_runtime import configure_threads

    configure_threads(resources.cpu_quota())
    with torch.inference_mode():
        module(example)
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            module(example)
            count += 1
    return count / (time.perf_counter() - start)


def in_process_rows_per_s(module, width: int, batch_sizes, seconds: float = 2.0) -> dict[int, float]:
    """Rows per second for each batch size."""
    import torch

    return {batch: batch * in_process_calls_per_s(module, torch.randn(batch, width), seconds) for batch in batch_sizes}


def save_model(root: Path, name: str, module, config: dict, version: int = 1) -> None:
    import torch

    (root / name / str(version)).mkdir(parents=True)
    (root / name / "config.json").write_text(json.dumps(config))
    torch.jit.script(module).save(str(root / name / str(version) / "model.pt"))


def mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"
