"""Real models for the tests, built with torch: Triton layout, SageMaker layout, archives, and gates that
hold model code at a known point so concurrency is tested by order of events, never by timing."""

import errno
import functools
import gc
import os
import tarfile
import textwrap
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List

import orjson
import torch
from google.protobuf import json_format, text_format

from container.backends import WorkerOptions, load_backends, server_memory
from container.backends.torch_runtime import free_memory, release_memory
from container.core import Core
from container.models.cache import MemoryCache
from container.models.registry import Registry, Runtime
from container.models.triton_schema import model_config_pb2 as pb
from container.scheduling import scheduler_for

MIB = 1 << 20


class AddSub(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor):
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Reordered(torch.nn.Module):
    """forward() names its arguments after the config's inputs, in the other order."""

    def forward(self, INPUT1: torch.Tensor, INPUT0: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"OUTPUT1": INPUT0 - INPUT1, "OUTPUT0": INPUT0 + INPUT1}


class Positional(torch.nn.Module):
    def forward(self, first: torch.Tensor, second: torch.Tensor):
        return first * 10 + second


class Scale(torch.nn.Module):
    def __init__(self, factor: float = 2.0):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class Sized(torch.nn.Module):
    """Holds `mib` MiB of float32 weights, so the cache accounts a known size."""

    def __init__(self, mib: float):
        super().__init__()
        self.register_buffer("weights", torch.ones(int(mib * MIB) // 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weights[0]


class Allocates(torch.nn.Module):
    """Asks the allocator for x[0] PiB of scratch: torch's own out-of-memory error on any machine at 1024
    (1 EiB is past any address space, so it fails where the kernel overcommits too: 64 TiB did not, on a
    128 GiB machine with overcommit on)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grabbed = torch.empty([int(x[0, 0].item()) * (1 << 50)], dtype=torch.uint8)
        return x + grabbed.numel() * 0


class Faults(torch.nn.Module):
    """Fails as a broken GPU context fails, whatever its device, when x[0] is negative."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x[0, 0].item() < 0:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return x


class Upper(torch.nn.Module):
    def forward(self, TEXT: List[str]) -> List[str]:
        return [t.upper() for t in TEXT]


def aoti_package(program: torch.export.ExportedProgram, path: Path) -> Path:
    """An AOTInductor package of `program` at `path`. Inductor's compile warns with advice for the machine
    it compiles on (an H200's TF32 tensor cores left off, a softmax's reduction split): advice, not faults,
    which the suite's warnings-as-errors would turn into a failed compile."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return path


def tensor(name: str, data_type: str, dims) -> dict:
    return {"name": name, "data_type": data_type, "dims": list(dims)}


def triton_model(root: Path, name: str, module: torch.nn.Module, inputs, outputs, max_batch_size=0,
                 versions=(1,), config_format="json", **config) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    document = {"name": name, "platform": "pytorch_libtorch", "max_batch_size": max_batch_size,
                "input": inputs, "output": outputs, **config}
    if config_format == "json":
        (directory / "config.json").write_bytes(orjson.dumps(document))
    else:
        (directory / "config.pbtxt").write_text(_pbtxt(document))
    scripted = torch.jit.script(module)
    for version in versions:
        (directory / str(version)).mkdir()
        scripted.save(str(directory / str(version) / "model.pt"))
    return directory


def fp32_model(root: Path, name: str, module=None, dims=(4,), max_batch_size=8, **kwargs) -> Path:
    """One FP32 input `x`, one FP32 output `y` of the same shape."""
    return triton_model(root, name, module or Scale(), [tensor("x", "TYPE_FP32", dims)],
                        [tensor("y", "TYPE_FP32", dims)], max_batch_size, **kwargs)


def ensemble(root: Path, name: str, inputs, outputs, steps, config: dict | None = None, **scheduling) -> Path:
    """`steps`: `ensemble_step`s; `config`: more of the ensemble's own config (`max_batch_size`, `response_cache`)."""
    directory = root / name
    (directory / "1").mkdir(parents=True)  # an ensemble's version directory is empty, as on Triton
    document = {"name": name, "platform": "ensemble", "input": inputs, "output": outputs, **(config or {}),
                "ensemble_scheduling": {"step": steps, **scheduling}}
    (directory / "config.pbtxt").write_text(_pbtxt(document))
    return directory


def ensemble_step(model: str, inputs: dict, outputs: dict) -> dict:
    return {"model_name": model, "model_version": -1, "input_map": inputs, "output_map": outputs}


def sized_model(root: Path, name: str, mib: float) -> Path:
    return fp32_model(root, name, Sized(mib))


def handler_model(root: Path, name: str, inference_py: str | None = None, module=None) -> Path:
    """SageMaker layout: model.pt (TorchScript) at the top and optional code/inference.py."""
    directory = root / name
    directory.mkdir(parents=True)
    if module is not None:
        torch.jit.script(module).save(str(directory / "model.pt"))
    if inference_py is not None:
        (directory / "code").mkdir()
        (directory / "code" / "inference.py").write_text(textwrap.dedent(inference_py))
    return directory


def python_model(root: Path, name: str, model_py: str, config: dict | None = None, versions=(1,)) -> Path:
    """A python-backend model: `<version>/model.py`, and `config.pbtxt` from `config` when given."""
    directory = root / name
    for version in versions:
        (directory / str(version)).mkdir(parents=True)
        (directory / str(version) / "model.py").write_text(textwrap.dedent(model_py))
    if config is not None:
        (directory / "config.pbtxt").write_text(_pbtxt({"name": name, "backend": "python", **config}))
    return directory


def make_core(root: Path, budget: int = 1 << 34, schedulers=scheduler_for, load_threads: int = 4, **worker_options) -> Core:
    """The core facade over the models under `root`, as the server makes it: a CPU budget of `budget`
    bytes, handler and python-backend workers started with `worker_options`."""
    runtime = Runtime(functools.partial(load_backends, options=WorkerOptions(**worker_options)), release_memory, free_memory, server_memory)
    return Core(Registry(str(root), MemoryCache({"cpu": budget}, evict=True), runtime, load_threads=load_threads), schedulers)


def archive(directory: Path, path: Path, top_folder: bool = False) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for item in sorted(directory.rglob("*")):
            relative = item.relative_to(directory)
            tar.add(item, arcname=str(Path(directory.name) / relative if top_folder else relative), recursive=False)
    return path


class Gate:
    """A FIFO that model code blocks on: `entered` appears when the code reaches it; `release()` lets
    every waiter through. Lives outside the model root so it is never taken for a model."""

    def __init__(self, directory: Path, name: str):
        self.fifo = directory / f"{name}.fifo"
        self.marker = directory / f"{name}.entered"
        os.mkfifo(self.fifo)

    def code(self) -> str:
        """Python statements for model code: mark arrival, then block until released."""
        return f"open({str(self.marker)!r}, 'w').close(); open({str(self.fifo)!r}).read()"

    def wait_entered(self, timeout: float = 30) -> None:
        wait_for(self.marker.exists, timeout, f"model code never reached gate {self.fifo.name}")

    def release(self, timeout: float = 30) -> None:
        """The code marks its arrival just before it opens the FIFO: a release right after `wait_entered`
        may find it not open yet (ENXIO), and waits for it to be."""
        def opened() -> int | None:
            try:
                return os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                return None

        os.close(wait_for(opened, timeout, f"nobody opened gate {self.fifo.name}"))


def gates(directory: Path, *names: str) -> dict[str, Gate]:
    return {name: Gate(directory, name) for name in names}


def gated_load(gate: Gate) -> str:
    """inference.py whose model_fn waits at `gate`, then loads model.pt."""
    return f"""
import torch
def model_fn(model_dir):
    {gate.code()}
    return torch.jit.load(model_dir + "/model.pt")
"""


def gated_predict(gate: Gate) -> str:
    """inference.py whose predict_fn waits at `gate`, then runs the model."""
    return f"""
def predict_fn(data, model):
    {gate.code()}
    return model(data)
"""


def defined(source: str, name: str):
    """`name` as `source` (the text of a model's code/ module) defines it: the test's reference and the
    model's code are one text."""
    namespace: dict = {}
    exec(textwrap.dedent(source), namespace)
    return namespace[name]


def descriptors(pid: int) -> list[str]:
    """What a live process's descriptors point at; one it closes while they are read is left out."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed meanwhile
            pass
    return targets


@contextmanager
def cycles_of_ours() -> Iterator[list[str]]:
    """Collects what the code inside leaves in reference cycles and lists, once it ends, the kinds of those
    objects the server made: of a class of its own, or a frame or function of its code."""
    left: list[str] = []
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage to look at
    try:
        yield left
        gc.collect()
        left.extend(sorted({_kind(thing) for thing in gc.garbage if _ours(thing)}))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _ours(thing) -> bool:
    code = getattr(thing, "f_code", None) or getattr(thing, "__code__", None)
    if code is not None:
        return "/container/" in code.co_filename
    return type(thing).__module__.startswith("container.")


def _kind(thing) -> str:
    code = getattr(thing, "f_code", None) or getattr(thing, "__code__", None)
    return f"{type(thing).__name__} {code.co_name}" if code is not None else type(thing).__qualname__


def wait_for(predicate, timeout: float = 30, message: str = "condition not met"):
    """Poll with a deadline (the one sanctioned wait in tests)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} within {timeout} s")
        time.sleep(0.02)


def exited(pid: int) -> bool:
    """Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def poll(predicate, timeout: float = 30, message: str = "condition not met"):
    """`wait_for` for a test that runs greenlets: the wait lets them run."""
    import gevent

    with gevent.Timeout(timeout, AssertionError(f"{message} within {timeout} s")):
        while not (value := predicate()):
            gevent.sleep(0.001)
    return value


def take_turns(turns: int = 100) -> None:
    """Let every runnable greenlet, and the event loop's watchers, take `turns` turns: a count of the
    loop's iterations, not a time, before asserting that something has not happened."""
    import gevent

    for _ in range(turns):
        gevent.sleep(0)


def _pbtxt(document: dict) -> str:
    return text_format.MessageToString(json_format.ParseDict(document, pb.ModelConfig()))


def manifest_env(manifest: Path, model_root: str) -> dict[str, str]:
    """The container env a KServe ServingRuntime manifest runs the server with, less what a test moves
    to this machine: the model root (checked to be `model_root`) and the ports (the test's free ones)."""
    import yaml

    container = yaml.safe_load(manifest.read_text())["spec"]["containers"][0]
    assert container["args"] == ["serve"]  # what a test's server runs: ./serve
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env.pop("SERVE_MODEL_ROOT") == model_root
    env.pop("SAGEMAKER_BIND_TO_PORT"), env.pop("SERVE_GRPC_PORT")
    return env
