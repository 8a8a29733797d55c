"""What the coordinator tells its operator on the console: one plain line for each event that
changes who works on the run (workers joining, leaving, lost), for each version published,
for each change of the active set, and for scoring cut off or the coordinator stalling. Built from the same event records metrics.jsonl gets, so
the two never disagree; per-lease and per-batch events stay in the metrics only."""

from __future__ import annotations

import logging

log = logging.getLogger("echo2.coordinator")


def log_event(event: dict) -> None:
    line = describe(event)
    if line is not None:
        level, text = line
        log.log(level, text)


def describe(event: dict) -> tuple[int, str] | None:
    kind = event.get("kind")
    if kind == "worker_registered":
        relay = event.get("relay_address") or "none: a broadcast leaf"
        return logging.INFO, (f"worker {event['worker_id']} joined from {event.get('source') or '?'} "
                              f"(engine {event['engine']}, ${event['price_per_hour']:g}/h, relay {relay})")
    if kind == "worker_left":
        return logging.INFO, f"worker {event['worker_id']} left ({event['leases_requeued']} leases back in the queue)"
    if kind == "worker_lost":
        return logging.WARNING, (f"worker {event['worker_id']} lost: silent past coordinator.worker_timeout_s "
                                 f"({event['leases_requeued']} leases back in the queue)")
    if kind == "version_published":
        return logging.INFO, (f"version {event['version']} published: broadcast {event['broadcast_mode']}, first hop "
                              f"{', '.join(event['first_hop']) or 'none'}, depth {event['max_depth']}")
    if kind == "activation" and event.get("changed"):
        active = ", ".join(event["active"]) or "none"
        trigger = f" after {event['trigger']}" if event.get("trigger") else ""
        return logging.INFO, f"active workers now {active}{trigger}: {event['reason']}"
    if kind == "scoring_over_budget":
        refused = "; its submissions are refused for a while" if event["refused"] else ""
        return logging.WARNING, (f"worker {event['worker_id']}'s {event['what']} completion {event['completion']} "
                                 f"scored 0: {event['reason']} (strike {event['strikes']}{refused})")
    if kind == "coordinator_stalled":
        return logging.WARNING, (f"the coordinator stalled for {event['stall_s']:.1f} s; {event['workers_excused']} "
                                 "workers' timeouts extended by as much")
    if kind == "bad_peer":
        return logging.WARNING, f"bad peer reported: {event.get('peer_id')} by {event.get('reporter_id')}"
    return None
