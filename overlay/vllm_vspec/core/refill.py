"""Refill holding: admit new requests in groups while a batch is decoding.

Every step that carries a prefill costs the decoding requests a slower step,
and each prefill-carrying step is one the controller cannot reward as a
decode step. When requests arrive one by one into a busy engine, each
arrival makes its own such step. Holding the newcomers back until
`refill_batch` of them wait (or as many as there are free slots) puts their
prefills into one step instead. The price is latency: no request waits more
than `refill_max_wait_steps` scheduler steps, an idle engine admits at once,
and requests that were already running (preempted ones) are never held.

Plain Python, no vLLM import: the scheduler asks `hold()` once per step with
what it sees and, when told to hold, schedules this step without its waiting
queue.
"""

from __future__ import annotations

from typing import Iterable


class RefillGate:
    def __init__(self, refill_batch: int, max_wait_steps: int):
        self.refill_batch = refill_batch
        self.max_wait_steps = max_wait_steps
        self._step = 0
        self._first_seen: dict[str, int] = {}  # waiting request id -> step it was first seen

    def hold(self, waiting_ids: Iterable[str], all_fresh: bool, num_running: int,
             free_slots: int) -> bool:
        """True: schedule this step without admitting any waiting request.
        `all_fresh`: every waiting request is new (none was ever running)."""
        self._step += 1
        waiting = list(waiting_ids)
        self._first_seen = {r: self._first_seen.get(r, self._step) for r in waiting}
        if not waiting or self.refill_batch <= 0 or not all_fresh or num_running == 0:
            return False
        if len(waiting) >= min(self.refill_batch, free_slots):
            return False
        oldest = min(self._first_seen.values())
        return self._step - oldest < self.max_wait_steps
