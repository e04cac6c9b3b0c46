"""Calls that arrive together cross the channel together. The calls a front-end makes for one key (V2
inferences of one model and version, SageMaker invokes of one model) in one turn of its event loop go to
the model process as one call of a group operation, which pays its per-call costs once (a frame each way, a greenlet, the model's
lease, a wake-up of its scheduler) and streams back an item for each call as it is done: a fast
request does not wait for a slow one in its group.

A group is sent at the end of the turn in which it opened (on an asyncio loop, two turns later: below);
but while the group sent before it for the same key has not been taken up by the model process (that
group's first item, TAKEN, says it has), it waits, open to the calls of later turns. So the busier the
model process, the larger the groups, and a lone request, with nothing before it, waits for nothing.
gRPC's front-ends need the wait: grpcio hands their loop one call a turn, so that 97% of the groups of
one turn held one call (measured at 64 connections).

A large call goes alone (its data would make the group's frame large); so does a group that, packed,
is past what the model process reads: each of its calls is sent again on its own."""

import asyncio
import functools
import itertools
import os
from collections import Counter
from typing import Callable, Iterator

from gevent.event import AsyncResult

from container.channel import wire
from container.channel.hub_client import HubChannelClient
from container.errors import Cancelled, PayloadTooLarge, ServeError
from container.inference import Client
from container.kept import KeptGreenlets

MOST_CALLS = 64  # calls in one group
MOST_BYTES = 256 << 10  # data in one group; a call with more goes alone
KEEP_SENDERS = 64  # greenlets kept to send the next groups (kept.py)
TAKEN = []  # the item a group operation yields first: the model process has taken the group up
TURNS_OPEN = 3  # turns of an asyncio loop a group gathers calls in: the one it opened in, and two more


def group_items(results: Iterator[tuple[int, object]], answer: Callable[[int, object], list],
                tickets: list | None = None) -> "GroupItems":
    """A group operation's items, made in the model process: TAKEN, then for each (position, result) as it
    comes, [position, error] when the result is an exception, else [position, None, *answer(position,
    result)]. `tickets`: each call's cancellation (inference.Ticket), which the channel cancels for a
    front-end whose caller of that call went away (`GroupItems.cancel`)."""
    return GroupItems(_items(results, answer), tickets)


class GroupItems:
    """A group operation's items, and a way to cancel one of its calls (the channel's CANCEL of a
    position) while the others go on."""

    __slots__ = ("_items", "_tickets")

    def __init__(self, items: Iterator[list], tickets: list | None):
        self._items, self._tickets = items, tickets

    def __iter__(self) -> Iterator[list]:
        return self._items

    def cancel(self, position: int) -> None:
        if self._tickets is not None and 0 <= position < len(self._tickets):
            self._tickets[position].cancel()


def _items(results: Iterator[tuple[int, object]], answer: Callable[[int, object], list]) -> Iterator[list]:
    yield TAKEN
    for position, result in results:
        if isinstance(result, Exception):
            yield [position, wire.error_of(result)]
        else:
            yield [position, None, *answer(position, result)]


class _Group:
    __slots__ = ("key", "calls", "answers", "clients", "size", "sent", "taken", "stream", "answered")

    def __init__(self, key: tuple):
        self.key, self.calls, self.answers, self.clients, self.size = key, [], [], [], 0
        self.answered = 0  # its calls' answers come so far
        self.sent = self.taken = False
        self.stream = None  # AsyncGroups': the id of the channel stream that carries it, once sent


class _Groups:
    """What both kinds of front-end share: which group a call joins, and what becomes of a group's
    answers; a subclass sends groups and waits for answers the way its event loop does (`_start`,
    `_waiter`, `_settle`), and knows a call whose caller left (`_left`)."""

    def __init__(self, op: str):
        """`op(front-end pid, *key, calls)`: the model process's group operation, which yields TAKEN, then
        [position, error] or [position, None, *answer] for each of `calls`; the pid tells it whose
        connections the calls' numbers are."""
        self.op = op
        self._pid = os.getpid()  # read once: a system call each time
        self._open: dict[tuple, _Group] = {}
        self._untaken: Counter[tuple] = Counter()  # groups sent for each key that the model process has not taken up

    def _join(self, key: tuple, call: list, size: int, client: Client | None = None):
        """The group `call` joins and the waiter for its answer there: the group open for `key` (a new one
        when none is open, or when the call is large). A new group is sent at the end of this turn, or, while one sent before it for
        `key` is not yet taken up, once it is (a large one goes at once)."""
        group = self._open.get(key) if size < MOST_BYTES else None
        if group is None:
            group = _Group(key)
            if size < MOST_BYTES:
                self._open[key] = group
            if size >= MOST_BYTES or not self._untaken[key]:
                self._send_soon(group)
        waiter = self._waiter()
        group.calls.append(call)
        group.answers.append(waiter)
        group.clients.append(client)
        group.size += size
        if len(group.calls) >= MOST_CALLS or group.size >= MOST_BYTES:
            self._close(group)
            self._send_soon(group)
        return group, waiter

    def _send_soon(self, group: _Group) -> None:
        """`group` goes at the end of this turn (calls made meanwhile join it)."""
        if not group.sent:
            group.sent = True
            self._untaken[group.key] += 1
            self._start(group)

    def _close(self, group: _Group) -> None:
        """No call joins `group` any more (it is full, or being sent)."""
        if self._open.get(group.key) is group:
            del self._open[group.key]

    def _taken(self, group: _Group) -> None:
        """The model process took `group` up (or its call ended): the group waiting behind it goes."""
        if group.taken:
            return
        group.taken = True
        key = group.key
        self._untaken[key] -= 1
        if self._untaken[key]:
            return
        del self._untaken[key]
        waiting = self._open.get(key)
        if waiting is not None:
            self._send_soon(waiting)

    def _answer(self, group: _Group, item: list) -> None:
        if item == TAKEN:
            self._taken(group)
            return
        position, error, *answer = item
        self._settle(group.answers[position], error, answer)
        group.answered += 1

    def _fail(self, group: _Group, failure: Exception) -> None:
        """The whole call failed: a group past what the model process reads (nothing of it was sent) goes
        again call by call; otherwise every call not yet answered hears why (a bug here, as a 500 that
        shows nothing of it: no caller waits for ever)."""
        if isinstance(failure, PayloadTooLarge) and len(group.calls) > 1:
            for call, answer, client in zip(group.calls, group.answers, group.clients, strict=True):
                alone = _Group(group.key)
                alone.calls.append(call)
                alone.answers.append(answer)
                alone.clients.append(client)
                self._send_soon(alone)
            return
        error = wire.error_of(failure)
        for answer in group.answers:
            self._settle(answer, error, None)

    def _live(self, group: _Group) -> bool:
        """Just before `group` is sent: the calls whose callers left meanwhile (`_left`) are taken out of it,
        and told so; False when none is left, and then nothing is sent."""
        left = [self._left(group, position) for position in range(len(group.calls))]
        if any(left):
            gone = wire.error_of(Cancelled("the client went away before its request reached the model process"))
            for answer in itertools.compress(group.answers, left):
                self._settle(answer, gone, None)
            group.calls, group.answers, group.clients = (
                [item for item, out in zip(items, left, strict=True) if not out]
                for items in (group.calls, group.answers, group.clients))
        return bool(group.calls)

    @staticmethod
    def _result(error, answer) -> list:
        if error is not None:
            raise wire.error_from(*error)
        return answer

    def _ended(self, group: _Group) -> None:
        """`group`'s stream ended: a call it left unanswered (a bug) is told so."""
        if group.answered < len(group.calls):
            self._fail(group, ServeError(f"the model process left a call of {self.op!r} unanswered"))


class Groups(_Groups):
    """On a gevent hub (the HTTP front-ends)."""

    def __init__(self, channel: HubChannelClient, op: str):
        super().__init__(op)
        self.channel = channel
        self._senders = KeptGreenlets(self._send, KEEP_SENDERS)

    def call(self, key: tuple, call: list, size: int, client: Client | None = None) -> list:
        """The answer to `call` (a list: what its op takes for one call) made as part of the group open
        for `key`; `size`: the bytes of data it carries; `client`: the connection it came on, which, closed
        before the group is sent, leaves the call out (Cancelled). Its error is raised here."""
        return self._result(*self._join(key, call, size, client)[1].get())

    def _start(self, group: _Group) -> None:
        self._senders.start(group)  # it starts once this turn's other greenlets have run

    def _waiter(self) -> AsyncResult:
        return AsyncResult()

    @staticmethod
    def _settle(waiter: AsyncResult, error, answer) -> None:
        if not waiter.ready():
            waiter.set((error, answer))

    @staticmethod
    def _left(group: _Group, position: int) -> bool:
        client = group.clients[position]
        return client is not None and client.gone

    def _send(self, group: _Group) -> None:
        self._close(group)
        if not self._live(group):
            self._taken(group)
            return
        try:
            for item in self.channel.stream(self.op, self._pid, *group.key, group.calls):
                self._answer(group, item)
            self._ended(group)
        except Exception as exc:  # past what the model process reads, it went away, the call failed, or a bug
            self._fail(group, exc)
        finally:
            self._taken(group)


class AsyncGroups(_Groups):
    """On an asyncio loop (the gRPC front-ends). A group is sent by a callback of the loop and its answers are
    heard by another, from the channel's reader (`ChannelClient.start_stream`), rather than by a task and an
    async generator, which cost turns of the loop and 13 µs more CPU a group (a throwaway measure, a lone
    call): a gRPC front-end's groups are small, as grpcio hands its loop about a call a turn."""

    def __init__(self, channel, op: str):
        """`channel`: a channel.client.ChannelClient."""
        super().__init__(op)
        self.channel = channel
        self._loop: asyncio.AbstractEventLoop | None = None  # the running loop, once asked (a system call each time in 3.11)

    async def call(self, key: tuple, call: list, size: int) -> list:
        """`Groups.call` on the loop. A call cancelled (its gRPC client went away: Triton's request
        cancellation) is left out of its group if the group has not gone yet; else it is cancelled in the
        model process alone, or, once every call in the group is, the group's stream is."""
        group, waiter = self._join(key, call, size)
        try:
            answered = await waiter
        except asyncio.CancelledError:
            if group.stream is not None:
                if _abandoned(group):
                    self.channel.cancel(group.stream)  # and no more of it is heard: nobody waits for it
                    self._taken(group)
                else:
                    self.channel.cancel(group.stream, group.answers.index(waiter))
            raise
        return self._result(*answered)

    def _start(self, group: _Group) -> None:
        """`group` gathers the calls of two more turns of the loop before it goes: grpcio hands its loop the
        calls that arrived together over successive turns (measured, tiny calls at 64 connections: groups of
        1.6 calls when they went after the turn they opened in, 2.8 a turn later, 3.2 two turns later, and no
        more calls/s three turns later; 17-20% more calls/s than at first, and one connection's p50 level)."""
        self._running().call_soon(self._send_after, TURNS_OPEN, group)

    def _send_after(self, turns: int, group: _Group) -> None:
        if turns > 1:
            self._loop.call_soon(self._send_after, turns - 1, group)
        else:
            self._send(group)

    def _waiter(self) -> asyncio.Future:
        return self._running().create_future()

    def _running(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @staticmethod
    def _settle(waiter: asyncio.Future, error, answer) -> None:
        if not waiter.done():
            waiter.set_result((error, answer))

    @staticmethod
    def _left(group: _Group, position: int) -> bool:
        return group.answers[position].cancelled()

    def _send(self, group: _Group) -> None:
        self._close(group)
        if not self._live(group):  # every caller went away while it waited to go
            self._taken(group)
            return
        try:
            group.stream = self.channel.start_stream(self.op, [self._pid, *group.key, group.calls],
                                                     functools.partial(self._heard, group))
        except Exception as exc:  # past what the model process reads, it is away, or a bug
            self._fail(group, exc)
            self._taken(group)

    def _heard(self, group: _Group, kind: int, value) -> None:
        """A frame of `group`'s stream: its answers, or its end."""
        try:
            if kind == wire.ITEMS:
                for item in value:
                    self._answer(group, item)
                return
            if kind == wire.ITEM:
                self._answer(group, value)
                return
            if kind == wire.ERROR:
                raise wire.error_from(*value)
            self._ended(group)
        except Exception as exc:  # the call failed, or an answer this front-end cannot read (a bug)
            if kind in (wire.ITEM, wire.ITEMS):
                self.channel.cancel(group.stream)
            self._fail(group, exc)
        self._taken(group)


def _abandoned(group: _Group) -> bool:
    """Whether every call in an AsyncGroups' group was cancelled."""
    return all(answer.cancelled() for answer in group.answers)
