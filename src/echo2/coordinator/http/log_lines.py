"""What the coordinator tells its operator on the console: one plain line for each event that
changes who works on the run (workers joining, leaving, lost), for each version published, for
each change of the active set, and for scoring cut off or the coordinator stalling. Built from
the same event records metrics.jsonl gets, so the two never disagree; per-lease and per-batch
events stay in the metrics only.

Most of what a line says comes from untrusted workers (ids, engines, relay addresses, reports):
every interpolated value goes through `_shown`, which escapes control characters, so a worker
cannot end a line and forge the next one, or send terminal escape sequences to the console."""

from __future__ import annotations

import logging
import re

log = logging.getLogger("echo2.coordinator")

# C0 controls (newline, carriage return, ESC...), DEL, C1 controls (some terminals read 0x9b as
# ESC [) and the Unicode line and paragraph separators (a line break to some log viewers)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def _shown(value: object) -> str:
    """`value` as text fit for one console line: control characters escaped (as repr does)."""
    return _CONTROL.sub(_escape, str(value))


def log_event(event: dict) -> None:
    line = describe(event)
    if line is not None:
        level, text = line
        log.log(level, text)


def describe(event: dict) -> tuple[int, str] | None:
    e = _Shown(event)
    kind = event.get("kind")
    if kind == "worker_registered":
        relay = e.get("relay_address") or "none: a broadcast leaf"
        return logging.INFO, (f"worker {e['worker_id']} joined from {e.get('source') or '?'} "
                              f"(engine {e['engine']}, ${event['price_per_hour']:g}/h, relay {relay})")
    if kind == "worker_left":
        return logging.INFO, f"worker {e['worker_id']} left ({e['leases_requeued']} leases back in the queue)"
    if kind == "worker_lost":
        return logging.WARNING, (f"worker {e['worker_id']} lost: silent past coordinator.worker_timeout_s "
                                 f"({e['leases_requeued']} leases back in the queue)")
    if kind == "version_published":
        return logging.INFO, (f"version {e['version']} published: broadcast {e['broadcast_mode']}, first hop "
                              f"{e.joined('first_hop')}, depth {e['max_depth']}")
    if kind == "activation" and event.get("changed"):
        trigger = f" after {e['trigger']}" if event.get("trigger") else ""
        return logging.INFO, f"active workers now {e.joined('active')}{trigger}: {e['reason']}"
    if kind == "scoring_over_budget":
        refused = "; its submissions are refused for a while" if event["refused"] else ""
        return logging.WARNING, (f"worker {e['worker_id']}'s {e['what']} completion {e['completion']} "
                                 f"scored 0: {e['reason']} (strike {e['strikes']}{refused})")
    if kind == "coordinator_stalled":
        return logging.WARNING, (f"the coordinator stalled for {event['stall_s']:.1f} s; {e['workers_excused']} "
                                 "workers' timeouts extended by as much")
    if kind == "uninformative_streak":
        return logging.WARNING, (f"{event['dropped_in_a_row']} groups in a row scored all alike (every completion "
                                 "right, or every one wrong) and were dropped; one is trained anyway so the run goes "
                                 "on. The task may be too hard or too easy for the model, or set "
                                 "grpo.drop_uninformative_groups = false")
    if kind == "bad_peer":
        return logging.WARNING, _bad_peer_line(e, event.get("avoided_by"))
    if kind == "relay_checked":
        return logging.WARNING, _relay_checked_line(e, event.get("verdict"))
    return None


_REPORT_EFFECTS = {
    "everyone": "no one is sent to it now (a check caught it)",
    "reporter": "the reporter is not sent to it again",
    "check": "the reporter is not sent to it again; the coordinator fetches the chunk itself to check",
    "refuted": "a check found that chunk genuine: the report counts against the reporter",
}


def _bad_peer_line(e: _Shown, avoided_by: object) -> str:
    said = (f"bad peer reported: {e.get('peer_id')} by {e.get('reporter_id')} (version {e.get('version')}, "
            f"chunk {e.get('chunk_index')})")
    effect = _REPORT_EFFECTS.get(str(avoided_by))
    if effect is not None:
        return f"{said}: {effect}"
    return f"{said}: no effect ({e.get('peer_id')} is the origin, the reporter itself or not among its sources)"


def _relay_checked_line(e: _Shown, verdict: object) -> str:
    checked = (f"checked {e.get('peer_id')}'s chunk {e.get('chunk_index')} of version {e.get('version')} "
               f"({e.get('seen')})")
    if verdict == "bad":
        return f"{checked}: bad bytes; no one is sent to it now"
    if verdict == "good":
        return f"{checked}: genuine; the reports of {e.joined('refuted')} count against them"
    return f"{checked}: could not be fetched; that confirms nothing"


class _Shown:
    """An event's fields as `_shown` text (None stays None, so `or` defaults still work)."""

    def __init__(self, event: dict) -> None:
        self.event = event

    def __getitem__(self, key: str) -> str:
        return _shown(self.event[key])

    def get(self, key: str) -> str | None:
        value = self.event.get(key)
        return None if value is None or value == "" else _shown(value)

    def joined(self, key: str) -> str:
        """A list field, comma-separated ("none" when empty)."""
        return ", ".join(_shown(item) for item in self.event[key]) or "none"
