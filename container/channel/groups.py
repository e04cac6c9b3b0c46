"""Calls that arrive together cross the channel together. The calls a front-end makes for one key (V2
inferences of one model and version) in one turn of its event loop go to the model process as one call
of a group operation, which pays its per-call costs once (a frame each way, a greenlet, the model's
lease, a wake-up of its scheduler) and streams back an item for each call as it is done: a fast
request does not wait for a slow one in its group. The group is sent at the end of the turn in which
it opened, so a lone request waits for nothing.

A large call goes alone (its data would make the group's frame large); so does a group that, packed,
is past what the model process reads: each of its calls is sent again on its own."""

import gevent
from gevent.event import AsyncResult

from container.channel import wire
from container.channel.hub_client import HubChannelClient
from container.errors import PayloadTooLarge, ServeError

MOST_CALLS = 64  # calls in one group
MOST_BYTES = 256 << 10  # data in one group; a call with more goes alone


class _Group:
    __slots__ = ("key", "calls", "answers", "size")

    def __init__(self, key: tuple):
        self.key, self.calls, self.answers, self.size = key, [], [], 0


class Groups:
    def __init__(self, channel: HubChannelClient, op: str):
        """`op(*key, calls)`: the model process's group operation, which yields [position, error] or
        [position, None, *answer] for each of `calls`."""
        self.channel, self.op = channel, op
        self._open: dict[tuple, _Group] = {}

    def call(self, key: tuple, call: list, size: int) -> list:
        """The answer to `call` (a list: what its op takes for one call) made as part of the group open
        for `key` this turn; `size`: the bytes of data it carries. Its error is raised here."""
        group = self._open.get(key) if size < MOST_BYTES else None
        if group is None:
            group = _Group(key)
            gevent.spawn_raw(self._send, group)  # it starts once this turn's other greenlets have run
            if size < MOST_BYTES:
                self._open[key] = group
        answer = AsyncResult()
        group.calls.append(call)
        group.answers.append(answer)
        group.size += size
        if (len(group.calls) >= MOST_CALLS or group.size >= MOST_BYTES) and self._open.get(key) is group:
            del self._open[key]
        error, result = answer.get()
        if error is not None:
            wire.raise_error(*error)
        return result

    def _send(self, group: _Group) -> None:
        if self._open.get(group.key) is group:
            del self._open[group.key]
        try:
            for position, error, *answer in self.channel.stream(self.op, *group.key, group.calls):
                group.answers[position].set((error, answer))
            failure = ServeError(f"the model process left a call of {self.op!r} unanswered")
        except PayloadTooLarge as exc:
            if len(group.calls) > 1:  # nothing of it was sent: each call goes alone
                for call, answer in zip(group.calls, group.answers, strict=True):
                    alone = _Group(group.key)
                    alone.calls.append(call)
                    alone.answers.append(answer)
                    gevent.spawn_raw(self._send, alone)
                return
            failure = exc
        except ServeError as exc:  # the model process went away, or the whole call failed
            failure = exc
        error = wire.error_of(failure)
        for answer in group.answers:
            if not answer.ready():
                answer.set((error, None))
