"""Requests to one model that arrived together (a front-end's group), each under
a lease of its own (core.leases), as every protocol serves them: every lease entered before any request
is decoded, so a batcher counts them all as on their way; each decoded against the leased model (its
failure its own); the decoded ones handed to the core together; and each answered, its lease left, as
it is done. A request alone takes `serve_one`, which does the same without a group's generators."""

from typing import Callable, Iterator

from container.core import Lease


def serve_leased(leases: list[Lease], decoders: list[Callable], run_all: Callable) -> Iterator[tuple[int, object]]:
    """`decoders[i](lease)` → (the core's request, `finish(response)` → the answer); `run_all(leases,
    requests)` yields (index, response or the exception it failed with) as each is done (core.infer_all,
    core.transform_all). Yields (position, answer or exception) for each."""
    held = dict(enumerate(leases))
    for lease in leases:
        lease.__enter__()
    try:
        decoded, positions = [], []
        for position, decode in enumerate(decoders):
            try:
                decoded.append(decode(leases[position]))
                positions.append(position)
            except Exception as exc:
                held.pop(position).__exit__()
                yield position, exc
        running = run_all([leases[p] for p in positions], [request for request, _ in decoded]) if decoded else ()
        for index, response in running:
            position, finish = positions[index], decoded[index][1]
            try:
                result = response if isinstance(response, Exception) else finish(response)
            except Exception as exc:
                result = exc
            held.pop(position).__exit__()
            yield position, result
    finally:
        for lease in held.values():
            lease.__exit__()


def serve_one(lease: Lease, decode: Callable, run: Callable):
    """`serve_leased` for a request alone: `run(lease, request)` is core.infer or core.transform. Returns
    its answer; raises what it failed with."""
    with lease:
        request, finish = decode(lease)
        return finish(run(lease, request))
