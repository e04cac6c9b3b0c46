"""How requests reach a model's execution threads, chosen by the model's Triton config: the sequence
batcher (`sequence_batching`), the dynamic batcher (`dynamic_batching`), or direct execution — always
off the event loop, on as many instance threads as `instance_group` asks for."""

import functools
from typing import Callable

from gevent import get_hub

from container.inference import InferRequest
from container.models.config import PYTHON_BACKEND, instance_count
from container.models.recovery import Recover
from container.models.signature import Signature
from container.scheduling.direct import DirectScheduler
from container.scheduling.dynamic import DynamicBatcher
from container.scheduling.job import Job
from container.scheduling.sequence import SequenceBatcher


def scheduler_for(model_name: str, config=None, signature: Signature | None = None, recover: Recover | None = None,
                  inline_below_ns: int = 0, wait_limit: float = 60.0, instances: int | None = None,
                  holding: Callable[[int], None] = lambda count: None):
    """`signature`: the model's, with its implicit states' initial values (default: the config's);
    `recover`: frees device memory after an out-of-memory error (recovery.py); `inline_below_ns`: see
    inline.py; `wait_limit`: seconds a sequence request may wait for a slot; `instances`: requests it
    runs at once, for a model without a config (a handler model's workers; default: the config's);
    `holding`: told how many sequences hold state whenever that changes."""
    if instances is None:
        instances = instance_count(config) if config is not None else 1
    if config is not None and config.backend == PYTHON_BACKEND:
        inline_below_ns = 0  # its executions wait on a process of its own: never on the event loop
    if config is not None and config.HasField("sequence_batching"):
        return SequenceBatcher(model_name, config, signature or Signature.from_config(config), instances, recover,
                               wait_limit, holding)
    if config is not None and config.HasField("dynamic_batching") and config.max_batch_size > 0:
        return DynamicBatcher(model_name, config, instances, recover, inline_below_ns)
    return DirectScheduler(model_name, instances, recover, inline_below_ns)


def new_job(backend, statistics, request: InferRequest, items: int, batching=None) -> Job:
    respond = request.respond
    if respond is not None:  # the backend sends a decoupled model's responses from an execution thread
        loop = get_hub().loop
        respond = functools.partial(loop.run_callback_threadsafe, respond)
    return Job(backend, statistics, request.inputs, request.outputs, items, request.parameters, respond=respond,
               request_id=request.request_id, batching=batching)
