"""Memory accounting and the eviction policy. Pure bookkeeping: the registry does the loading and freeing.

Each model holds bytes on one or more devices (`cpu`, `cuda:0`, …); each device has a budget. A new
model reserves its estimate before it loads; if that does not fit, the least-recently-used idle models
are chosen as victims — all at once or none, so a model that cannot fit evicts nothing.

Entries are keyed by the registry's model objects (their `str()` names them in messages), so a model
being reloaded and its replacement are accounted apart while both exist.
"""

from collections import OrderedDict
from typing import Callable, Hashable

from container.errors import InsufficientMemory


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


class MemoryCache:
    def __init__(self, limits: dict[str, int], evict: bool, ceilings: dict[str, int] | None = None):
        """`limits`: what models may hold per device, as configured; `ceilings`: what the machine leaves
        them where that may be less (the host's RAM less the server's processes at start), lowered by
        what the server's own parts take later (`server_holds`). A device's budget is the lesser."""
        self._limits, self._ceilings = dict(limits), dict(ceilings or {})
        self.evict = evict
        self._sizes: OrderedDict[Hashable, dict[str, int]] = OrderedDict()  # least recently used first
        self.server_holds({})

    def server_holds(self, sizes: dict[str, int]) -> None:
        """The server's own parts hold `sizes` now beyond its start (runtimes prepared on demand, the
        fork server): bytes no model is charged, which the machine no longer leaves to models."""
        self.budgets = {device: min(limit, self._ceilings[device] - sizes.get(device, 0))
                        if device in self._ceilings else limit for device, limit in self._limits.items()}

    def used(self, device: str) -> int:
        return sum(sizes.get(device, 0) for sizes in self._sizes.values())

    def size_of(self, name: Hashable) -> dict[str, int]:
        return dict(self._sizes.get(name, {}))

    def touch(self, name: Hashable) -> None:
        if name in self._sizes:
            self._sizes.move_to_end(name)

    def reserve(self, name: Hashable, sizes: dict[str, int], idle: Callable[[Hashable], bool]) -> dict:
        """Account `sizes` for `name` (replacing an earlier estimate); return the models to evict first,
        with the sizes they held. Raises InsufficientMemory, changing nothing, when even evicting every
        idle model would not do."""
        victims = {victim: self._sizes.pop(victim) for victim in self._victims(name, sizes, idle)}
        self._sizes[name] = dict(sizes)
        self._sizes.move_to_end(name)
        return victims

    def fits(self, name: Hashable, sizes: dict[str, int]) -> bool:
        """Whether `sizes` for `name` (in place of what it holds now) fit every budget without evicting."""
        held = self._sizes.get(name, {})
        return all(self.used(d) - held.get(d, 0) + need <= self.budgets[d] for d, need in sizes.items() if d in self.budgets)

    def charge(self, name: Hashable, sizes: dict[str, int]) -> None:
        """Account `sizes` for `name` as they are, whether they fit or not (a model measured bigger than
        its estimate while it serves)."""
        self._sizes[name] = dict(sizes)

    def release(self, name: Hashable) -> None:
        self._sizes.pop(name, None)

    def idle_on(self, device: str, idle: Callable[[Hashable], bool], keep: Hashable = None) -> dict:
        """Idle models holding memory on `device` with their sizes, least recently used first (for
        out-of-memory recovery)."""
        return {n: dict(s) for n, s in self._sizes.items() if n is not keep and s.get(device) and idle(n)}

    def _victims(self, name: Hashable, sizes: dict[str, int], idle: Callable[[Hashable], bool]) -> list:
        short = {}
        for device, need in sizes.items():
            budget = self.budgets.get(device)
            if budget is None:
                continue
            if need > budget:
                raise InsufficientMemory(
                    f"model '{name}' needs {_mib(need)} on {device}, more than the whole budget of {_mib(budget)}"
                )
            over = self.used(device) - self._sizes.get(name, {}).get(device, 0) + need - budget
            if over > 0:
                short[device] = over
        if not short:
            return []
        if not self.evict:
            raise InsufficientMemory(self._no_room(name, short, "eviction is off (SERVE_EVICTION=none)"))
        victims = []
        for candidate, held in self._sizes.items():
            if candidate is name or not idle(candidate) or not any(held.get(d) for d in short):
                continue
            victims.append(candidate)
            for device in list(short):
                short[device] -= held.get(device, 0)
                if short[device] <= 0:
                    del short[device]
            if not short:
                return victims
        raise InsufficientMemory(self._no_room(name, short, "the other models are busy (serving requests, or holding a sequence's state)"))

    def _no_room(self, name: Hashable, short: dict[str, int], why: str) -> str:
        lacking = ", ".join(f"{_mib(n)} on {d}" for d, n in short.items())
        return f"no room for model '{name}': {lacking} more is needed and {why}"


def total_by_device(sizes_list) -> dict[str, int]:
    """Bytes per device, summed over several {device: bytes} maps."""
    total: dict[str, int] = {}
    for sizes in sizes_list:
        for device, size in sizes.items():
            total[device] = total.get(device, 0) + size
    return total
