"""Weight dissemination (bytes in, bytes out; no torch): manifest signing, relay servers, the
worker fetch with failover, the learner origin, the topology planner and latency model. The
wire types they exchange (the manifest and its chunk verification, the plan, each worker's
assignment, bad-peer reports) are echo2.protocol.manifest's and echo2.protocol.broadcast's.

    # learner (torch loop; the origin serves from its own thread and event loop)
    origin = OriginThread(load_private_key(cfg.learner_key_path), cfg, auth_token=token, host="0.0.0.0")
    origin.start()
    signed = origin.publish(version, payload)              # -> coordinator, with origin.stats(v)
    # coordinator (pure function; both messages are pydantic and serialise to JSON)
    plan = plan_broadcast(version, OriginInfo(url=learner_url, upload_bytes_per_s=...), peers, cfg)
    for assignment in plan.assignments: send(assignment.worker_id, signed, assignment)
    # worker (asyncio)
    relay = RelayServer(cfg, auth_token=token, host="0.0.0.0", port=0); await relay.start()
    result = await fetch_version(signed, assignment, public_key=load_public_key(cfg.learner_public_key),
                                 held_version=held, config=cfg, relay=relay, auth_token=token,
                                 worker_id=me, report_bad_peer=report)  # result.payload, result.metrics

Names resolve lazily (PEP 562): importing one submodule, e.g. `echo2.broadcast.topology` for the
planner, must not pull in the runtime (aiohttp, cryptography), which the control plane does not
need.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    # catchup (which forms stay served, the cheapest way to the newest version)
    "ServedForm": "echo2.broadcast.catchup",
    "cheapest_path": "echo2.broadcast.catchup",
    "retained": "echo2.broadcast.catchup",
    # delta (lossless version deltas) and the learner's encoder
    "decode_delta": "echo2.broadcast.delta",
    "encode_delta": "echo2.broadcast.delta",
    "same_layout": "echo2.broadcast.delta",
    "VersionEncoder": "echo2.broadcast.encoder",
    # fetch
    "ReportBadPeer": "echo2.broadcast.fetch",
    "fetch_version": "echo2.broadcast.fetch",
    "new_session": "echo2.broadcast.fetch",
    # latency
    "predict_plan_s": "echo2.broadcast.latency",
    "predict_worker_s": "echo2.broadcast.latency",
    # metrics
    "FetchMetrics": "echo2.broadcast.metrics",
    "FetchResult": "echo2.broadcast.metrics",
    "LatencySummary": "echo2.broadcast.metrics",
    "OriginMetrics": "echo2.broadcast.metrics",
    "latency_summary": "echo2.broadcast.metrics",
    # origin
    "LoopThread": "echo2.broadcast.origin",
    "Origin": "echo2.broadcast.origin",
    "OriginThread": "echo2.broadcast.origin",
    # relay
    "RelayServer": "echo2.broadcast.relay",
    # signing
    "ManifestRejected": "echo2.broadcast.signing",
    "generate_private_key": "echo2.broadcast.signing",
    "key_id": "echo2.broadcast.signing",
    "load_private_key": "echo2.broadcast.signing",
    "load_public_key": "echo2.broadcast.signing",
    "public_key_from_hex": "echo2.broadcast.signing",
    "public_key_hex": "echo2.broadcast.signing",
    "save_private_key": "echo2.broadcast.signing",
    "save_public_key": "echo2.broadcast.signing",
    "sign_manifest": "echo2.broadcast.signing",
    "verify_manifest": "echo2.broadcast.signing",
    # topology
    "late_joiner_assignment": "echo2.broadcast.topology",
    "plan_broadcast": "echo2.broadcast.topology",
    # wire
    "BroadcastFailed": "echo2.broadcast.wire",
    "FetchAborted": "echo2.broadcast.wire",
    "SourceError": "echo2.broadcast.wire",
    "SourceMisbehaved": "echo2.broadcast.wire",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'echo2.broadcast' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_HOME)
