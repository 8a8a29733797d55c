"""The discrete-event core: a binary heap of (time, sequence, callback, args).

Ties in time run in the order they were scheduled (the sequence number), so a run is a pure
function of its inputs and seed. A plain heap instead of SimPy: the simulator's handlers are a
few lines each, so per-event overhead dominates, and a SimPy timeout costs about twice a heap
push/pop here (benchmarks/sim_perf.py measures both). Cancellation is by the caller: handlers
check a token they were scheduled with (see `fleet.SimWorker.epoch`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self) -> None:
        self.now_s = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.processed = 0
        self.stopped = False
        """Set by a handler when the run is complete; the loop returns before the next event."""

    def at(self, time_s: float, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` at absolute time `time_s` (never earlier than now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(time_s, self.now_s), self._seq, callback, args))

    def after(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> None:
        self.at(self.now_s + delay_s, callback, *args)

    def run(self, horizon_s: float) -> bool:
        """Process events in time order until a handler sets `stopped` (True), or the queue
        empties or the next event lies beyond `horizon_s` (False)."""
        heap, pop = self._heap, heapq.heappop
        processed = 0
        while heap and not self.stopped:
            if heap[0][0] > horizon_s:
                break
            time_s, _, callback, args = pop(heap)
            self.now_s = time_s
            callback(*args)
            processed += 1
        self.processed += processed
        return self.stopped
