"""TorchServe as a peer row for handler models: the stack SageMaker's PyTorch inference container runs,
PyPI's `torchserve` with `sagemaker-pytorch-inference`'s handler service, serving a SageMaker model
directory (`model.pt`, `code/inference.py`) as that container starts it: the directory named in
`--models`, `code/` on PYTHONPATH, the toolkit's own default properties with the container's settings
after them. `make bench-torchserve` installs it into its own venv (Java comes from the machine);
without it, scenarios leave the TorchServe rows out and say so."""

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.harness import CORES, PROJECT, end_group, free_port, starting_on

VENV = Path(os.environ.get("TORCHSERVE_VENV", PROJECT / "bench" / ".torchserve"))
MISSING = "TorchServe: not installed here (`make bench-torchserve` installs it, with Java on the machine), so its rows are left out."
HANDLER_SERVICE = "sagemaker_pytorch_serving_container.handler_service"


def installed() -> bool:
    return (VENV / "bin" / "torchserve").is_file() and shutil.which("java") is not None


class TorchServe:
    """torchserve on free ports serving the SageMaker model directory `model_dir` as the model `model`,
    with `workers` workers; `scale` changes that through the management API."""

    def __init__(self, model_dir: Path, workers: int, cores=CORES):
        self._scratch = tempfile.TemporaryDirectory(prefix="bench-torchserve-")
        scratch = Path(self._scratch.name)
        ports = [free_port() for _ in range(3)]
        self.url, self._management = f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
        toolkit = next(VENV.glob("lib/python3*/site-packages/sagemaker_pytorch_serving_container"))
        properties = (toolkit / "etc" / "default-ts.properties").read_text().rstrip("\n") + "\n" + "\n".join([
            f"inference_address={self.url}", f"management_address={self._management}",
            f"metrics_address=http://127.0.0.1:{ports[2]}", f"default_workers_per_model={workers}",
            "default_response_timeout=120", f"default_service_handler={HANDLER_SERVICE}:handle", ""])
        (scratch / "config.properties").write_text(properties)
        (scratch / "store").mkdir()
        environment = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(model_dir / "code"),
                       "LOG_LOCATION": str(scratch / "logs"), "METRICS_LOCATION": str(scratch / "logs")}
        self.log = scratch / "torchserve.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(VENV / "bin" / "torchserve"), "--start", "--foreground", "--ncs", "--disable-token-auth",
                 "--model-store", str(scratch / "store"), "--ts-config", str(scratch / "config.properties"),
                 "--models", f"model={model_dir}"],
                cwd=scratch, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=starting_on(cores))
        self._wait(workers)

    def scale(self, workers: int) -> None:
        """Exactly `workers` workers, once all have loaded the model."""
        request = urllib.request.Request(f"{self._management}/models/model?min_worker={workers}&max_worker={workers}"
                                         f"&synchronous=true", method="PUT")
        urllib.request.urlopen(request, timeout=120).read()
        self._wait(workers)

    def _wait(self, workers: int) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                described = json.loads(urllib.request.urlopen(f"{self._management}/models/model", timeout=5).read())
                ready = [w for w in described[0]["workers"] if w["status"] == "READY"]
                if len(ready) == workers:
                    return
            except (OSError, ValueError, KeyError, IndexError):
                pass
            time.sleep(0.5)
        tail = self.log.read_text()[-3000:]
        self.stop()
        raise RuntimeError(f"TorchServe did not start {workers} worker(s):\n{tail}")

    def stop(self) -> None:
        end_group(self.process)
        self._scratch.cleanup()
