"""Faults, each with real relays on loopback: a relay killed mid-transfer, a relay corrupting a
chunk, a forged manifest, a replayed older version, truncated / stalled / endless / oversized /
slow streams. In every case the other workers end with the right version and no worker keeps,
forwards or loads a byte that fails verification."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import CHUNK, FAST, TOKEN, payload, run, start_cluster
from echo2.broadcast import ManifestRejected, fetch_version, generate_private_key, sign_manifest
from echo2.broadcast.faults import Fault, FaultKind
from echo2.broadcast.wire import BroadcastFailed
from echo2.protocol.manifest import build_manifest, verify_payload


def _assert_all_correct(results: dict, data: bytes) -> None:  # type: ignore[type-arg]
    for worker, result in results.items():
        assert not isinstance(result, BaseException), f"{worker}: {result!r}"
        assert result.payload == data, worker
        verify_payload(result.manifest, result.payload)


def test_relay_killed_mid_transfer_children_resume_from_first_missing_chunk() -> None:
    async def scenario() -> None:
        die = Fault(FaultKind.DIE, at_chunk=6)
        cluster = await start_cluster(4, faults={"w1": die})
        try:
            data = payload()
            signed, plan = cluster.origin.publish(1, data), cluster.plan(1)
            tasks = {w: asyncio.ensure_future(cluster.fetch(w, signed, plan)) for w in cluster.relays}
            await die.triggered.wait()
            tasks["w1"].cancel()  # the process is gone: its own download dies with it
            await cluster.relays["w1"].stop()
            survivors = {w: await tasks[w] for w in ("w0", "w2", "w3")}
            _assert_all_correct(survivors, data)
            w2 = survivors["w2"].metrics
            assert w2.resumed_at_chunks == [6]  # resumed, not restarted from zero
            assert w2.bytes_by_source == {"w1": 6 * CHUNK, "w0": len(data) - 6 * CHUNK}
            assert survivors["w3"].metrics.bytes_by_source == {"w2": len(data)}  # w3 never noticed
            assert cluster.reports == []  # a crash is not misbehaviour
            assert cluster.origin.stats(1).bytes_sent == len(data)
        finally:
            await cluster.stop()

    run(scenario())


def test_relay_corrupting_a_chunk_is_bypassed_and_reported() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(4, faults={"w1": Fault(FaultKind.CORRUPT, at_chunk=5)})
        try:
            data = payload()
            results = await cluster.fetch_all(cluster.origin.publish(1, data), cluster.plan(1))
            _assert_all_correct(results, data)
            w2 = results["w2"].metrics
            assert w2.bad_peers == ["w1"] and w2.resumed_at_chunks == [5]
            assert w2.bytes_by_source == {"w1": 5 * CHUNK, "w0": len(data) - 5 * CHUNK}
            [report] = cluster.reports
            assert (report.peer_id, report.reporter_id, report.chunk_index, report.reason) == ("w1", "w2", 5,
                                                                                              "corrupt_chunk")
            # what the coordinator checks the report by: the form fetched and the hash of what came
            assert report.form == "full" and len(report.got_sha256) == 64
            assert report.got_sha256 != results["w2"].manifest.chunk_sha256[5]
            # the corrupt chunk was never forwarded: w3 streamed from w2 without a single failure
            assert results["w3"].metrics.source_failures == [] and results["w3"].metrics.bad_peers == []
        finally:
            await cluster.stop()

    run(scenario())


def test_a_genuine_chunk_in_the_wrong_place_is_refused() -> None:
    """Mix-and-match: a relay sends a real, verified chunk, but the wrong one (another index of
    the same version here). Its hash is not the manifest's for that index: refused and reported."""

    async def scenario() -> None:
        cluster = await start_cluster(2, faults={"w0": Fault(FaultKind.MIX, at_chunk=4)})
        try:
            data = payload()
            results = await cluster.fetch_all(cluster.origin.publish(1, data), cluster.plan(1))
            _assert_all_correct(results, data)
            w1 = results["w1"].metrics
            assert w1.bad_peers == ["w0"] and w1.resumed_at_chunks == [4]
            assert w1.bytes_by_source == {"w0": 4 * CHUNK, "origin": len(data) - 4 * CHUNK}
            assert [(r.peer_id, r.chunk_index, r.reason) for r in cluster.reports] == [("w0", 4, "corrupt_chunk")]
        finally:
            await cluster.stop()

    run(scenario())


def test_forged_manifest_is_refused_before_any_traffic() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(2)
        try:
            data = payload()
            good = cluster.origin.publish(1, data)
            await cluster.fetch_all(good, cluster.plan(1))
            evil = payload(seed=99)
            forged_key = sign_manifest(build_manifest(2, evil, CHUNK), generate_private_key())
            tampered = good.model_copy(
                update={"manifest_json": good.manifest_json.replace('"version":1', '"version":2')})
            for forged in (forged_key, tampered):
                results = await cluster.fetch_all(forged, cluster.plan(2), held_version=1)
                assert all(isinstance(r, ManifestRejected) for r in results.values())
            assert cluster.origin.stats(2).bytes_sent == 0
            for relay in cluster.relays.values():
                assert relay.held_version == 1 and relay.incoming is None  # still serving v1, nothing begun
        finally:
            await cluster.stop()

    run(scenario())


def test_replayed_older_version_is_refused() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(2)
        try:
            signed1 = cluster.origin.publish(1, payload(seed=1))
            await cluster.fetch_all(signed1, cluster.plan(1))
            data2 = payload(seed=2)
            _assert_all_correct(await cluster.fetch_all(cluster.origin.publish(2, data2), cluster.plan(2),
                                                        held_version=1), data2)
            sent_before = cluster.origin.stats(1).bytes_sent
            replay = await cluster.fetch_all(signed1, cluster.plan(1), held_version=2)
            assert all(isinstance(r, ManifestRejected) and "not newer" in str(r) for r in replay.values())
            assert cluster.origin.stats(1).bytes_sent == sent_before
            assert all(relay.held_version == 2 for relay in cluster.relays.values())
        finally:
            await cluster.stop()

    run(scenario())


@pytest.mark.parametrize(
    ("kind", "failure", "reported"),
    [
        (FaultKind.TRUNCATE, "truncated", False),
        (FaultKind.STALL, "silent for", False),
        (FaultKind.KEEPALIVE_FOREVER, "only keepalives", False),
        (FaultKind.DRIBBLE, "slower than", False),
        (FaultKind.OVERSIZE, "manifest says", True),
    ],
)
def test_bad_stream_is_cut_off_and_resumed_elsewhere(kind: FaultKind, failure: str, reported: bool) -> None:
    async def scenario() -> None:
        cluster = await start_cluster(2, faults={"w0": Fault(kind, at_chunk=4)})
        try:
            data = payload()
            results = await cluster.fetch_all(cluster.origin.publish(1, data), cluster.plan(1))
            _assert_all_correct(results, data)
            w1 = results["w1"].metrics
            assert len(w1.source_failures) == 1 and failure in w1.source_failures[0], w1.source_failures
            assert w1.resumed_at_chunks == [4]
            assert w1.bytes_by_source == {"w0": 4 * CHUNK, "origin": len(data) - 4 * CHUNK}
            assert [r.peer_id for r in cluster.reports] == (["w0"] if reported else [])
        finally:
            await cluster.stop()

    run(scenario())


def test_every_source_failing_keeps_the_old_version_and_fails_children_fast() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(2)
        try:
            data1 = payload(seed=1)
            await cluster.fetch_all(cluster.origin.publish(1, data1), cluster.plan(1))
            cluster.origin.relay.fault = Fault(FaultKind.CORRUPT, at_chunk=3)  # the only source w0 has
            loop = asyncio.get_running_loop()
            started = loop.time()
            results = await cluster.fetch_all(cluster.origin.publish(2, payload(seed=2)), cluster.plan(2),
                                              held_version=1)
            assert isinstance(results["w0"], BroadcastFailed)
            assert isinstance(results["w1"], BroadcastFailed)  # w1 got the chunks w0 had, then its error
            assert loop.time() - started < FAST.stall_timeout_s * 2  # an error frame, not a stall
            for relay in cluster.relays.values():
                assert relay.held_version == 1
            assert {r.peer_id for r in cluster.reports} == {"origin"}
        finally:
            await cluster.stop()

    run(scenario())


def test_a_declared_slow_link_cannot_lower_the_cutoff_below_the_fixed_floor() -> None:
    """A plan's rate comes from link speeds workers declare: a relay declaring 100 B/s once
    lowered its child's cutoff until a dribbling sender could hold the child for hours."""

    async def scenario() -> None:
        cluster = await start_cluster(2, faults={"w0": Fault(FaultKind.DRIBBLE, at_chunk=4)})
        try:
            data = payload()
            signed = cluster.origin.publish(1, data)
            plan = cluster.plan(1)
            declared = plan.for_worker("w1").model_copy(update={"planned_rate_bytes_per_s": 100.0})
            started = time.monotonic()
            _, result = await asyncio.gather(cluster.fetch("w0", signed, plan), fetch_version(
                signed, declared, public_key=cluster.public_key, held_version=None, config=cluster.config,
                relay=cluster.relays["w1"], auth_token=TOKEN, worker_id="w1", report_bad_peer=cluster.report))
            assert result.payload == data
            assert any("slower than" in f for f in result.metrics.source_failures), result.metrics.source_failures
            # cut off at the floor: stall_timeout_s + one chunk at rate_floor_bytes_per_s, not hours
            assert time.monotonic() - started < 10.0
        finally:
            await cluster.stop()

    run(scenario())
