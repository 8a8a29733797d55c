"""The version follower while a staged version is being swapped into the engine: the weights
are no longer staged and not yet loaded, and the fetch loop must not go after them again (the
relay already completed that version and refuses it, which was logged as a failed fetch)."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

from echo2.broadcast.metrics import FetchMetrics
from echo2.report.metrics import MetricsWriter
from echo2.rollout.follower import Staged, VersionFollower


class BlockingEngine:
    """load_state_dict waits until the test lets it finish."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.loaded: dict | None = None

    def load_state_dict(self, tensors: dict) -> None:
        self.entered.set()
        assert self.release.wait(timeout=10)
        self.loaded = tensors


def _staged(version: int) -> Staged:
    fetch = FetchMetrics(version=version, worker_id="w0", total_bytes=8, published_at=100.0, started_at=100.1,
                         first_chunk_at=100.2, verified_at=100.3, bytes_by_source={"learner": 8})
    return Staged(SimpleNamespace(version=version), {"w": version}, fetch)


def test_a_version_being_swapped_in_counts_as_held(tmp_path):
    follower = VersionFollower(SimpleNamespace(worker_id="w0", bytes_relayed=lambda version: 0, relay=None),
                               MetricsWriter(tmp_path / "m.jsonl", "worker"))
    follower.version = 13
    follower.staged = _staged(14)
    engine = BlockingEngine()

    async def main() -> list[int]:
        seen = [follower.holding()]
        swap = asyncio.create_task(follower.swap_into(engine))
        assert await asyncio.to_thread(engine.entered.wait, 10)
        seen.append(follower.holding())  # mid-swap: staged is empty, version still 13
        engine.release.set()
        await swap
        seen.append(follower.holding())
        return seen

    assert asyncio.run(asyncio.wait_for(main(), timeout=30)) == [14, 14, 14]
    assert follower.version == 14 and follower.loading == -1 and engine.loaded == {"w": 14}
    (record,) = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert record["kind"] == "weights_loaded" and record["version"] == 14


def test_a_failed_swap_leaves_the_old_version_held(tmp_path):
    follower = VersionFollower(SimpleNamespace(worker_id="w0"), MetricsWriter(None, "worker"))
    follower.version = 13
    follower.staged = _staged(14)

    class BrokenEngine:
        def load_state_dict(self, tensors: dict) -> None:
            raise RuntimeError("shape mismatch")

    try:
        asyncio.run(follower.swap_into(BrokenEngine()))
    except RuntimeError:
        pass
    else:
        raise AssertionError("the engine's error was swallowed")
    assert follower.version == 13 and follower.holding() == 13  # version 14 can be fetched again


def _info(version: int, published_at: float = 100.0):
    """An announcement of a full version (no delta base) as the follower reads it."""
    manifest = SimpleNamespace(base_version=None, adapter=None)
    return SimpleNamespace(version=version, published_at=published_at,
                           signed=SimpleNamespace(unverified_manifest=lambda: manifest))


class GoneEverywhere:
    """A receiver whose every source answers 410 for versions below `newest`: the follower must
    not fetch such a version again, and must ask the coordinator for the newest at once."""

    worker_id = "w0"

    def __init__(self, newest: int) -> None:
        self.newest, self.fetched = newest, []

    async def fetch(self, target, assignment, held, learner_key):
        from echo2.broadcast.wire import BroadcastFailed

        self.fetched.append(target.version)
        if target.version < self.newest:
            raise BroadcastFailed(f"version {target.version}: every source failed: HTTP 410", obsolete=True)
        return SimpleNamespace(payload=b"", metrics=None, manifest=target.signed.unverified_manifest())


def test_a_version_gone_everywhere_is_not_fetched_again_and_the_newest_is_asked_for(tmp_path, monkeypatch):
    import echo2.rollout.follower as follower_module

    monkeypatch.setattr(follower_module, "_deserialize", lambda payload: {"w": 1})
    monkeypatch.setattr(follower_module, "_rebuild", lambda base, payload, manifest: payload)
    receiver, asked = GoneEverywhere(newest=25), []
    follower = VersionFollower(receiver, MetricsWriter(tmp_path / "m.jsonl", "worker"),
                               ask_newest=lambda: asked.append(True))

    async def main() -> None:
        stop = asyncio.Event()
        follower.note(_info(19), SimpleNamespace(version=19), "")
        loop = asyncio.create_task(follower.run(stop))
        await asyncio.sleep(1.5)  # without the fix: v19 again every FETCH_RETRY_S
        assert receiver.fetched == [19] and asked == [True]
        follower.note(_info(25), SimpleNamespace(version=25), "")  # the heartbeat's answer
        await asyncio.wait_for(follower.ready.wait(), 5)
        stop.set()
        await loop

    asyncio.run(asyncio.wait_for(main(), timeout=30))
    assert receiver.fetched == [19, 25] and follower.staged.info.version == 25


def test_a_delta_that_does_not_rebuild_its_manifest_is_refused_and_never_loaded(tmp_path):
    """A delta whose chunks verify (the manifest hashes these very bytes) but that rebuilds
    something else than the tensors its manifest lists: refused, never staged or retried, and
    the version held stays the base for the next delta."""
    from tests.unit.broadcast.test_broadcast_delta import _publish, _versions

    from echo2.broadcast.metrics import FetchResult
    from echo2.protocol.manifest import build_manifest

    payloads = _versions(3)
    published = _publish(payloads, anchor_every=1000)
    good, form = published[2, "delta"]
    tampered = bytearray(bytes(form.payload))
    tampered[-3] ^= 0x01  # a different delta, yet one the chunk hashes below vouch for
    manifest = build_manifest(2, bytes(tampered), 4096, base_version=1, codec=good.codec, content=good.tensors,
                              content_bytes=good.content_bytes)
    metrics = FetchMetrics(version=2, worker_id="w0", total_bytes=len(tampered), published_at=1.0, started_at=1.0,
                           first_chunk_at=1.0, verified_at=1.0, bytes_by_source={"origin": len(tampered)})

    async def fetch(info, assignment, held, key):
        assert held == 1
        return FetchResult(payload=memoryview(bytes(tampered)), manifest=manifest, metrics=metrics)

    follower = VersionFollower(SimpleNamespace(worker_id="w0", fetch=fetch),
                               MetricsWriter(tmp_path / "m.jsonl", "worker"))
    follower.base = (1, payloads[1])
    target = SimpleNamespace(version=2)
    assert asyncio.run(follower._fetch(target, SimpleNamespace(version=2))) is None
    assert follower.rejected == {2} and follower.staged is None and follower.base == (1, payloads[1])
    (record,) = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert record["kind"] == "weights_fetch_failed" and "refused after reconstruction" in record["error"]


def test_a_generation_in_flight_swaps_a_staged_version_through_the_event_loop(tmp_path):
    """`inflight`: the generation thread sees the staged version as pending, and its swap is the
    follower's own (run on the event loop while the thread waits), metrics record included."""
    follower = VersionFollower(SimpleNamespace(worker_id="w0", bytes_relayed=lambda version: 0, relay=None),
                               MetricsWriter(tmp_path / "m.jsonl", "worker"))
    follower.version = 3
    engine = BlockingEngine()
    engine.release.set()

    def generation(inflight) -> list:
        seen = [inflight.version, inflight.pending()]
        follower.staged = _staged(4)  # the fetch loop staged a version meanwhile
        seen += [inflight.pending(), inflight.swap(), inflight.pending()]
        return seen

    async def main() -> list:
        return await asyncio.to_thread(generation, follower.inflight(engine, segment_tokens=16))

    assert asyncio.run(asyncio.wait_for(main(), timeout=30)) == [3, False, True, 4, False]
    assert engine.loaded == {"w": 4} and follower.version == 4
    (record,) = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert record["kind"] == "weights_loaded" and record["version"] == 4
