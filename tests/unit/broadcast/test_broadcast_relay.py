"""Loopback relays in one process: pipelined delivery, serving the old version until the new one
completes, one-to-many baseline, late joiners, auth, supersession and the learner's thread API."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import FAST, TOKEN, payload, run, start_cluster
from echo2.broadcast import (
    FetchAborted,
    OriginThread,
    RelayServer,
    fetch_version,
    generate_private_key,
    late_joiner_assignment,
    plan_broadcast,
)
from echo2.broadcast.faults import Fault, FaultKind
from echo2.broadcast.wire import BroadcastFailed
from echo2.protocol.broadcast import OriginInfo, PeerInfo
from echo2.protocol.manifest import verify_payload


def test_chain_delivers_every_worker_the_verified_payload_and_learner_sends_once() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(4)
        try:
            data = payload()
            signed = cluster.origin.publish(1, data)
            plan = cluster.plan(1)
            results = await cluster.fetch_all(signed, plan)
            for worker, result in results.items():
                assert result.payload == data and result.payload.readonly, worker
                verify_payload(result.manifest, result.payload)
                assert result.metrics.bytes_by_source == {plan.for_worker(worker).sources[0].peer_id: len(data)}
                assert cluster.relays[worker].held_version == 1
            assert cluster.origin.stats(1).bytes_sent == len(data)  # one copy, however many workers
            assert [cluster.relays[w].bytes_sent(1) for w in ("w0", "w1", "w2", "w3")] == [len(data)] * 3 + [0]
            metrics = results["w3"].metrics
            assert metrics.published_at <= metrics.started_at <= metrics.first_chunk_at <= metrics.verified_at
            assert metrics.loaded(at=metrics.verified_at + 1).publish_to_loaded_s == pytest.approx(
                metrics.publish_to_verified_s + 1)
        finally:
            await cluster.stop()

    run(scenario())


def test_relay_forwards_chunks_while_still_receiving() -> None:
    """The learner holds after 10 chunks; the chain's last worker must already have chunks then."""

    async def scenario() -> None:
        hold = Fault(FaultKind.HOLD, at_chunk=10)
        cluster = await start_cluster(3, origin_fault=hold)
        try:
            data = payload(30)
            signed = cluster.origin.publish(1, data)
            fetches = asyncio.gather(*(cluster.fetch(w, signed, cluster.plan(1)) for w in ("w0", "w1", "w2")))
            while (incoming := cluster.relays["w2"].incoming) is None or incoming.verified_chunks < 10:
                await asyncio.sleep(0.01)
            assert cluster.relays["w0"].incoming.verified_chunks == 10  # type: ignore[union-attr]
            assert cluster.relays["w0"].held_version is None  # nothing loaded yet anywhere
            hold.release.set()
            results = await fetches
            assert all(r.payload == data for r in results)
            # ...and those chunks came down the chain, not from the learner by some detour
            assert [r.metrics.bytes_by_source for r in results] == [{"origin": len(data)}, {"w0": len(data)},
                                                                    {"w1": len(data)}]
            assert cluster.origin.stats(1).bytes_sent == len(data)
        finally:
            await cluster.stop()

    run(scenario())


def test_old_version_is_served_until_the_new_one_completes() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(2)
        try:
            v1, v2 = payload(seed=1), payload(seed=2)
            signed1 = cluster.origin.publish(1, v1)
            await cluster.fetch_all(signed1, cluster.plan(1))
            hold = Fault(FaultKind.HOLD, at_chunk=5)
            cluster.origin.relay.fault = hold
            signed2 = cluster.origin.publish(2, v2)
            fetches = cluster.fetch_all(signed2, cluster.plan(2), held_version=1)
            task = asyncio.ensure_future(fetches)
            await hold.triggered.wait()
            # mid-transfer of v2, a newcomer still gets the complete v1 from w0
            late = late_joiner_assignment(1, PeerInfo(peer_id="late", upload_bytes_per_s=1, download_bytes_per_s=1,
                                                      reachable=False),
                                          [_peer(cluster, "w0")],
                                          origin=OriginInfo(url="http://127.0.0.1:9", upload_bytes_per_s=1),
                                          config=FAST)
            old = await fetch_version(signed1, late, public_key=cluster.public_key, held_version=None,
                                      config=FAST, auth_token=TOKEN)
            assert old.payload == v1 and old.metrics.bytes_by_source == {"w0": len(v1)}
            assert cluster.relays["w0"].held_version == 1
            hold.release.set()
            results = await task
            assert all(r.payload == v2 for r in results.values())
            assert cluster.relays["w0"].held_version == 2
            with pytest.raises(BroadcastFailed, match="410"):
                await fetch_version(signed1, late.model_copy(update={"sources": late.sources[:1]}),
                                    public_key=cluster.public_key, held_version=None, config=FAST, auth_token=TOKEN)
        finally:
            await cluster.stop()

    run(scenario())


def _peer(cluster, worker: str) -> PeerInfo:  # type: ignore[no-untyped-def]
    return PeerInfo(peer_id=worker, url=cluster.relays[worker].url, upload_bytes_per_s=1e8, download_bytes_per_s=1e8)


def test_one_to_many_baseline_serves_every_copy_from_the_learner() -> None:
    async def scenario() -> None:
        config = FAST.model_copy(update={"mode": "one_to_many"})
        cluster = await start_cluster(3, config=config)
        try:
            data = payload()
            results = await cluster.fetch_all(cluster.origin.publish(1, data), cluster.plan(1))
            assert all(r.payload == data and r.metrics.bytes_by_source == {"origin": len(data)}
                       for r in results.values())
            assert cluster.origin.stats(1).bytes_by_child == {w: len(data) for w in ("w0", "w1", "w2")}
        finally:
            await cluster.stop()

    run(scenario())


def test_late_joiner_gets_the_newest_version_from_a_holder() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(3)
        try:
            data = payload()
            signed = cluster.origin.publish(4, data)
            await cluster.fetch_all(signed, cluster.plan(4, ["w0", "w1"]))
            joiner = PeerInfo(peer_id="w2", url=cluster.relays["w2"].url, upload_bytes_per_s=1e8,
                              download_bytes_per_s=1e8)
            origin = OriginInfo(url=cluster.origin.url, upload_bytes_per_s=1e8)
            assignment = late_joiner_assignment(4, joiner, [_peer(cluster, "w1")], origin=origin, config=FAST)
            result = await fetch_version(signed, assignment, public_key=cluster.public_key, held_version=None,
                                         config=FAST, relay=cluster.relays["w2"], auth_token=TOKEN)
            assert result.payload == data and result.metrics.bytes_by_source == {"w1": len(data)}
        finally:
            await cluster.stop()

    run(scenario())


def test_wrong_token_is_refused() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(1)
        try:
            signed = cluster.origin.publish(1, payload())
            with pytest.raises(BroadcastFailed, match="401"):
                await cluster.fetch("w0", signed, cluster.plan(1), auth_token="wrong")
            assert cluster.origin.stats(1).bytes_sent == 0
            assert cluster.relays["w0"].held_version is None
        finally:
            await cluster.stop()

    run(scenario())


def test_newer_version_supersedes_an_unfinished_one() -> None:
    async def scenario() -> None:
        hold = Fault(FaultKind.HOLD, at_chunk=3)
        cluster = await start_cluster(2, origin_fault=hold)
        try:
            signed1 = cluster.origin.publish(1, payload(seed=1))
            first = asyncio.ensure_future(cluster.fetch_all(signed1, cluster.plan(1)))
            await hold.triggered.wait()
            cluster.origin.relay.fault = None
            data2 = payload(seed=2)
            results2 = await cluster.fetch_all(cluster.origin.publish(2, data2), cluster.plan(2))
            assert all(r.payload == data2 for r in results2.values())
            hold.release.set()
            results1 = await first
            assert all(isinstance(r, FetchAborted) for r in results1.values())
            assert all(cluster.relays[w].held_version == 2 for w in ("w0", "w1"))
        finally:
            await cluster.stop()

    run(scenario())


def test_too_many_children_are_sent_elsewhere() -> None:
    async def scenario() -> None:
        config = FAST.model_copy(update={"max_children": 1, "mode": "one_to_many"})
        hold = Fault(FaultKind.HOLD, at_chunk=2)
        cluster = await start_cluster(2, config=config, origin_fault=hold)
        try:
            signed = cluster.origin.publish(1, payload())
            plan = cluster.plan(1)
            first = asyncio.ensure_future(cluster.fetch("w0", signed, plan))
            await hold.triggered.wait()
            with pytest.raises(BroadcastFailed, match="503"):
                await cluster.fetch("w1", signed, plan)
            hold.release.set()
            assert (await first).metrics.bytes_by_source == {"origin": len(payload())}
        finally:
            await cluster.stop()

    run(scenario())


def test_origin_thread_serves_from_a_background_loop() -> None:
    origin = OriginThread(generate_private_key(), FAST, auth_token=TOKEN)
    url = origin.start()
    try:
        assert threading.current_thread() is threading.main_thread()
        data = payload()
        signed = origin.publish(1, data)
        with pytest.raises(ValueError, match="newer"):
            origin.publish(1, data)

        async def worker() -> bytes:
            relay = RelayServer(FAST, auth_token=TOKEN)
            await relay.start()
            try:
                peers = [PeerInfo(peer_id="w0", url=relay.url, upload_bytes_per_s=1, download_bytes_per_s=1)]
                plan = plan_broadcast(1, OriginInfo(url=url, upload_bytes_per_s=1), peers, FAST)
                result = await fetch_version(signed, plan.for_worker("w0"), public_key=origin.origin.public_key,
                                             held_version=None, config=FAST, relay=relay, auth_token=TOKEN)
                return result.payload
            finally:
                await relay.stop()

        assert run(worker()) == data
        assert origin.stats(1).bytes_sent == len(data)
    finally:
        origin.stop()
    with pytest.raises(ValueError, match="not started"):
        origin.publish(2, data)


def test_child_waits_for_a_parent_that_has_not_heard_of_the_version_yet() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(2)
        try:
            data = payload()
            signed, plan = cluster.origin.publish(1, data), cluster.plan(1)
            child = asyncio.ensure_future(cluster.fetch("w1", signed, plan))
            await asyncio.sleep(FAST.announce_wait_s / 2)  # the parent's control loop is late
            assert (await cluster.fetch("w0", signed, plan)).payload == data
            result = await child
            assert result.payload == data and result.metrics.bytes_by_source == {"w0": len(data)}
            assert result.metrics.source_failures == []
        finally:
            await cluster.stop()

    run(scenario())


def test_parent_that_never_hears_of_the_version_sends_its_child_elsewhere() -> None:
    async def scenario() -> None:
        cluster = await start_cluster(2)
        try:
            data = payload()
            result = await cluster.fetch("w1", cluster.origin.publish(1, data), cluster.plan(1))
            assert result.payload == data and result.metrics.bytes_by_source == {"origin": len(data)}
            assert "never announced" in result.metrics.source_failures[0]
        finally:
            await cluster.stop()

    run(scenario())


def test_parent_that_skipped_the_version_sends_its_child_elsewhere_at_once() -> None:
    """Versions can come faster than a parent fetches them: a child waiting at its parent for v1
    is sent on to its next source as soon as the parent starts v2 instead, not after
    announce_wait_s."""

    async def scenario() -> None:
        cluster = await start_cluster(2)
        try:
            first, second = payload(), payload(seed=1)
            signed1, plan1 = cluster.origin.publish(1, first), cluster.plan(1)
            signed2, plan2 = cluster.origin.publish(2, second), cluster.plan(2)
            loop = asyncio.get_running_loop()
            started = loop.time()
            child = asyncio.ensure_future(cluster.fetch("w1", signed1, plan1))  # waits at w0 for v1
            await asyncio.sleep(FAST.keepalive_interval_s)
            assert (await cluster.fetch("w0", signed2, plan2)).payload == second  # w0 skips v1
            result = await child
            assert result.payload == first and result.metrics.bytes_by_source == {"origin": len(first)}
            assert "skipped here" in result.metrics.source_failures[0]
            assert loop.time() - started < FAST.announce_wait_s
        finally:
            await cluster.stop()

    run(scenario())


def test_a_version_every_source_has_moved_past_fails_at_once() -> None:
    """Versions can come faster than a late worker's fetch: when every source answers that the
    version is gone (410, or skipped), asking again after a backoff cannot help, so the fetch
    ends after one pass and the worker goes after the newest version instead."""
    slow_backoff = FAST.model_copy(update={"retry_backoff_s": 5.0, "keep_versions": 1})

    async def scenario() -> None:
        cluster = await start_cluster(2, config=slow_backoff)
        try:
            signed1, plan1 = cluster.origin.publish(1, payload()), cluster.plan(1)
            signed2, plan2 = cluster.origin.publish(2, payload(seed=1)), cluster.plan(2)
            assert (await cluster.fetch("w0", signed2, plan2)).manifest.version == 2
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(BroadcastFailed, match="410") as failed:
                await cluster.fetch("w1", signed1, plan1)  # w1's sources: w0, then the origin
            assert loop.time() - started < slow_backoff.retry_backoff_s  # no second round
            assert str(failed.value).count("410") == 2  # each source asked once
            assert failed.value.obsolete  # the follower asks the coordinator for the newest now
            assert cluster.reports == []  # an obsolete version is nobody's misbehaviour
        finally:
            await cluster.stop()

    run(scenario())
