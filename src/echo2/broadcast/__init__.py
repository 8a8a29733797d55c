"""Weight dissemination (bytes in, bytes out; no torch): signed manifests, chunk verification,
relay servers, the worker fetch with failover, the learner origin, topology and latency model.

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
"""

from echo2.broadcast.fetch import ReportBadPeer, fetch_version, new_session
from echo2.broadcast.latency import (
    chain_s,
    ideal_s,
    one_to_many_s,
    predict_plan_s,
    predict_worker_s,
    tree_s,
)
from echo2.broadcast.manifest import (
    Manifest,
    TensorEntry,
    build_manifest,
    chunk_spans,
    decode_manifest,
    encode_manifest,
    verify_chunk,
    verify_payload,
)
from echo2.broadcast.metrics import (
    BadPeerReport,
    FetchMetrics,
    FetchResult,
    LatencySummary,
    OriginMetrics,
    latency_summary,
)
from echo2.broadcast.origin import LoopThread, Origin, OriginThread
from echo2.broadcast.relay import RelayServer
from echo2.broadcast.signing import (
    ManifestRejected,
    SignedManifest,
    generate_private_key,
    key_id,
    load_private_key,
    load_public_key,
    public_key_from_hex,
    public_key_hex,
    save_private_key,
    save_public_key,
    sign_manifest,
    verify_manifest,
)
from echo2.broadcast.topology import (
    ORIGIN_ID,
    Assignment,
    BroadcastPlan,
    OriginInfo,
    PeerInfo,
    Source,
    late_joiner_assignment,
    plan_broadcast,
)
from echo2.broadcast.wire import BroadcastFailed, FetchAborted, SourceError, SourceMisbehaved

__all__ = [
    "ORIGIN_ID",
    "Assignment",
    "BadPeerReport",
    "BroadcastFailed",
    "BroadcastPlan",
    "FetchAborted",
    "FetchMetrics",
    "FetchResult",
    "LatencySummary",
    "LoopThread",
    "Manifest",
    "ManifestRejected",
    "Origin",
    "OriginInfo",
    "OriginMetrics",
    "OriginThread",
    "PeerInfo",
    "RelayServer",
    "ReportBadPeer",
    "SignedManifest",
    "Source",
    "SourceError",
    "SourceMisbehaved",
    "TensorEntry",
    "build_manifest",
    "chain_s",
    "chunk_spans",
    "decode_manifest",
    "encode_manifest",
    "fetch_version",
    "generate_private_key",
    "ideal_s",
    "key_id",
    "late_joiner_assignment",
    "latency_summary",
    "load_private_key",
    "load_public_key",
    "new_session",
    "one_to_many_s",
    "plan_broadcast",
    "predict_plan_s",
    "predict_worker_s",
    "public_key_from_hex",
    "public_key_hex",
    "save_private_key",
    "save_public_key",
    "sign_manifest",
    "tree_s",
    "verify_chunk",
    "verify_manifest",
    "verify_payload",
]
