"""Whether a request may run on the event loop itself: a thread hand-off costs tens of µs of CPU,
more than a small model's whole execution, but the loop (every other request, /ping) waits for an
inline execution. A model qualifies while each of its latest executions cost less than the threshold
per item, times the request's items; a request estimated past it goes to a thread."""

from collections import deque

from container.models.statistics import Phases

# Executions a model is judged on before it may run inline, and while it does.
INLINE_WINDOW = 16


class InlineJudge:
    def __init__(self, below_ns: int):
        """`below_ns`: the longest the loop may wait for one execution (0: never inline)."""
        self.below_ns = below_ns
        self._per_item: deque[float] = deque(maxlen=INLINE_WINDOW)  # the latest executions' cost per item

    def fits(self, items: int) -> bool:
        recent = self._per_item
        return len(recent) == INLINE_WINDOW and max(recent) * max(items, 1) < self.below_ns

    def record(self, items: int, phases: Phases, inline: bool) -> None:
        # Inline, the wall time is what the loop waited. On a thread it also holds waits for the GIL the
        # loop keeps, and a model judged by it would look slow and never come back: there, CPU time.
        cost = phases.input_ns + phases.infer_ns + phases.output_ns if inline else phases.cpu_ns
        self._per_item.append(cost / max(items, 1))
