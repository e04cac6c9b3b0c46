"""The dynamic batcher's queue: priority levels, each with Triton's queue policy (max_queue_size,
default_timeout_microseconds, allow_timeout_override, timeout_action REJECT or DELAY)."""

from collections import deque
from dataclasses import dataclass
from typing import Callable

from gevent.event import Event

from container.errors import InvalidModel, QueueFull
from container.scheduling.job import Job, Stage, cut

REJECT, DELAY = 0, 1  # ModelQueuePolicy.TimeoutAction


@dataclass(frozen=True)
class Policy:
    max_queue_size: int = 0  # 0: unbounded
    default_timeout_us: int = 0  # 0: no timeout
    allow_timeout_override: bool = False
    timeout_action: int = REJECT

    @classmethod
    def from_config(cls, policy) -> "Policy":
        return cls(policy.max_queue_size, policy.default_timeout_microseconds, policy.allow_timeout_override,
                   policy.timeout_action)


class JobQueue:
    def __init__(self, dynamic_batching, queued: Callable[[Job], None]):
        """`queued(job)` is told of each part of a merge cut that stays queued (`take`, `split`), as its
        scheduler is of each job it puts."""
        config = dynamic_batching
        self._queued = queued
        self._cuts = not config.preserve_ordering  # a cut merge is answered part by part, not in its order
        self.levels = max(config.priority_levels, 1)
        self.default_level = config.default_priority_level if config.priority_levels else 1
        if not 1 <= self.default_level <= self.levels:
            raise InvalidModel(f"default_priority_level must be within 1..{self.levels} (priority_levels)")
        default = Policy.from_config(config.default_queue_policy)
        self.policies = {level: default for level in range(1, self.levels + 1)}
        for level, policy in config.priority_queue_policy.items():
            if not 1 <= level <= self.levels:  # a policy no request could be queued under: a mistake, as Triton says
                raise InvalidModel(f"priority_queue_policy names priority level {level}; levels are 1..{self.levels} "
                                   f"(priority_levels)")
            self.policies[level] = Policy.from_config(policy)
        self._queues = {level: deque() for level in range(1, self.levels + 1)}
        self._requests = 0  # queued, a merge's members each counted
        self.nonempty = Event()

    def __len__(self) -> int:
        """Requests queued (what queue_depth reports)."""
        return self._requests

    def merges(self, job: Job) -> bool:
        """Whether `job` may queue merged with others of its level (dynamic.py): no policy there counts
        its entries or times them out."""
        policy = self.policies[self.level_of(job)]
        return not (policy.max_queue_size or policy.default_timeout_us
                    or (policy.allow_timeout_override and job.parameters.get("timeout")))

    def put(self, job: Job) -> float | None:
        """Queue the job; returns its queue timeout in seconds (None: none). A full queue is a 503 at once."""
        level = self.level_of(job)
        policy = self.policies[level]
        if policy.max_queue_size and len(self._queues[level]) >= policy.max_queue_size:
            raise QueueFull(f"Exceeds maximum queue size: the queue for priority {level} holds its most "
                            f"({policy.max_queue_size} requests); retry later")  # Triton's words, then ours
        self._queues[level].append(job)
        self._requests += job.requests
        self.nonempty.set()
        timeout_us = policy.default_timeout_us
        requested = job.parameters.get("timeout") or 0
        if policy.allow_timeout_override and requested and (not timeout_us or requested < timeout_us):
            timeout_us = requested
        return timeout_us / 1e6 if timeout_us else None

    def level_of(self, job: Job) -> int:
        """The job's priority level: none, or one past the model's levels, is the default level, as Triton
        takes it (an ensemble's request hands its priority to steps whose models have fewer levels)."""
        priority = job.parameters.get("priority") or 0
        return priority if 0 < priority <= self.levels else self.default_level

    def expire(self, job: Job) -> bool:
        """The job's queue timeout passed while it waited: True if it must be rejected; with DELAY it
        stays, to be served after the requests that are still on time."""
        if self.policies[self.level_of(job)].timeout_action == DELAY:
            job.delayed = True
            return False
        return True

    def discard(self, job: Job) -> None:
        self._queues[self.level_of(job)].remove(job)
        self._requests -= job.requests
        self._update()

    def requeue(self, job: Job) -> None:
        """Put a job taken for a batch back at the front of its level."""
        job.stage = Stage.QUEUED
        self._queues[self.level_of(job)].appendleft(job)
        self._requests += job.requests
        self.nonempty.set()

    def split(self, job: Job, room: int) -> Job:
        """A merge taken for a batch cut to its first members within `room` items (job.cut): the rest go back
        first, as `requeue` puts a job; returns the part that stays in the batch."""
        first, rest = cut(job, room)
        first.stage = Stage.RUNNING
        self.requeue(rest)
        self._queued(rest)
        return first

    def take(self, limit: int) -> list[Job]:
        """The next batch: the first job by priority (delayed jobs last), then the queued jobs that can
        merge with it, in the same order, while their items stay within `limit`; a merge too large for
        the room left gives the batch its first members, and the rest keep its place (job.cut)."""
        ordered = [job for level in sorted(self._queues) for job in self._queues[level] if not job.delayed]
        ordered += [job for level in sorted(self._queues) for job in self._queues[level] if job.delayed]
        head, batch, items, rests = ordered[0], [], 0, {}
        key, most = head.batch_key(), max(limit, head.items)
        for job in ordered:
            if job.batch_key() != key:
                continue
            if items + job.items > most and job.members and self._cuts and (parts := cut(job, most - items)):
                job.stage = Stage.RUNNING  # out of the queue: its parts stand for it
                rests[job], job = parts[1], parts[0]
            if items + job.items <= most:
                batch.append(job)
                items += job.items
                if items == most:
                    break
        taken = set(batch)  # by identity: a deque's remove of each would scan the queue once a job
        for level, queue in self._queues.items():
            self._queues[level] = deque(rests.get(job, job) for job in queue if job not in taken)
        for job in batch:
            job.stage = Stage.RUNNING
            self._requests -= job.requests
        self._update()
        for rest in rests.values():  # once in the queue: one whose requests were all cancelled leaves it at once
            self._queued(rest)
        return batch

    def _update(self) -> None:
        if not self._requests:
            self.nonempty.clear()
