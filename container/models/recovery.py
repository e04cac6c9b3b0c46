"""Out-of-memory recovery, the one policy for loads and executions alike. An attempt that runs out of
device memory gets one recovery — the registry evicts idle models until the failed allocation fits
and drops cached blocks — and runs again; a batch that still does not fit runs in halves, down to
single requests, and only a request that fits in no batch is answered 507 (a load is not divisible:
it fails). It all happens on the event loop after the thread that failed has returned: no except
block, and so no traceback of the failed call, is alive."""

from typing import Callable

from container.errors import DeviceOutOfMemory

Recover = Callable[[str, int], None]  # (device, bytes the failed allocation asked for) → room made


def execute(attempt: Callable[[list], object], jobs: list, recover: Recover | None,
            divisible: bool = True) -> list[tuple[list, object, bool]]:
    """`attempt(part)` for the batch `jobs`, and for parts of it after an out-of-memory error (never
    when not `divisible`). Returns (part, result, True) for each part that ran and (part, exception,
    False) for each that failed; the parts cover `jobs` in order."""
    outcomes = []
    pending = [(jobs, recover is None)]  # (part, recovered already)
    while pending:
        part, recovered = pending.pop(0)
        try:
            outcomes.append((part, attempt(part), True))
            continue
        except DeviceOutOfMemory as exc:
            failure = exc.with_traceback(None)
        except Exception as exc:
            outcomes.append((part, exc, False))
            continue
        if not recovered:
            recover(failure.device, failure.requested)
            pending.insert(0, (part, True))
        elif divisible and len(part) > 1:
            half = len(part) // 2
            pending[:0] = [(part[:half], True), (part[half:], True)]
        else:
            outcomes.append((part, failure, False))
    return outcomes
