"""Whether a request may run on the event loop itself: a thread hand-off costs tens of µs of CPU,
more than a small model's whole execution, but the loop (every other request, /ping) waits for an
inline execution. A model qualifies while each of its latest executions cost less than the threshold
per item, times the request's items; a request estimated past it goes to a thread.

On the loop, an execution's cost is the wall time the loop waited. A model leaves the loop after two
executions in a row over the threshold: one alone may be another process taking the core (the
front-ends share the cores).

On a thread the cost is CPU time, as the wall time there holds waits for the GIL the loop keeps. But
with the loop busy on another core, that CPU time grows many times over (the GIL, and the objects
both sides touch, move between the cores' caches at every hand-off): a model of 45 µs cost 350-530 µs
on its thread, against 48 with both on one core. Judged by that alone, a small model sent to a thread
once under load stayed there. So a model on its threads whose latest execution there cost under
`_TRY_REACH` times the threshold tries the loop again; each try that fails at once makes the next wait
twice as many executions on the threads, up to `_MOST_BETWEEN_TRIES`. A tiny model under load (64
connections, two front-ends on two cores) ran 35-75% of its requests on a thread before these two
rules, 1-2% after."""

from collections import deque

from container.models.statistics import Phases

# Executions a model is judged on before it may run inline, and while it does.
INLINE_WINDOW = 16
_TRY_REACH = 4
_MOST_BETWEEN_TRIES = 1024


class InlineJudge:
    def __init__(self, below_ns: int):
        """`below_ns`: the longest the loop may wait for one execution (0: never inline)."""
        self.below_ns = below_ns
        self._loop: deque[float] = deque(maxlen=INLINE_WINDOW)  # per item, since the model last came to the loop
        self._thread: deque[float] = deque(maxlen=INLINE_WINDOW)  # per item, on its threads
        self._off_loop = 0  # executions on its threads since it last left the loop
        self._between_tries = INLINE_WINDOW  # executions on its threads before it may try the loop again
        self._over = False  # its latest execution on the loop took longer than the threshold

    def fits(self, items: int) -> bool:
        items = max(items, 1)
        if self._loop:
            return max(self._loop) * items < self.below_ns
        if self._off_loop < self._between_tries:
            return False
        thread = self._thread
        return max(thread) * items < self.below_ns or thread[-1] * items < _TRY_REACH * self.below_ns

    def record(self, items: int, phases: Phases, inline: bool) -> None:
        items = max(items, 1)
        if not inline:
            self._thread.append(phases.cpu_ns / items)
            self._off_loop += 1
            return
        waited = phases.input_ns + phases.infer_ns + phases.output_ns
        if waited < self.below_ns:
            self._loop.append(waited / items)
            self._over = False
            return
        if self._loop and not self._over:  # once may be the system's doing: another process took the core
            self._over = True
            return
        # Back to the threads; a try that failed at once makes the next one wait twice as long.
        self._between_tries = INLINE_WINDOW if self._loop else min(2 * self._between_tries, _MOST_BETWEEN_TRIES)
        self._loop.clear()
        self._off_loop = 0
        self._over = False
