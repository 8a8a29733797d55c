"""The coordinator's check of a reported relay (broadcast.chunk_check), against real relays on
loopback: the genuine chunk is "good", what no honest relay sends is "bad", and a relay that
cannot be asked confirms nothing ("unreachable")."""

from __future__ import annotations

import aiohttp
import pytest

from conftest import TOKEN, payload, run, start_cluster
from echo2.broadcast.chunk_check import check_chunk
from echo2.broadcast.faults import Fault, FaultKind
from echo2.broadcast.wire import bearer_headers

HEADERS = bearer_headers(TOKEN, "coordinator")


def test_a_chunk_is_judged_by_the_signed_manifest_as_a_child_would() -> None:
    async def scenario() -> None:
        faults = {"w1": Fault(FaultKind.CORRUPT, at_chunk=5), "w2": Fault(FaultKind.OVERSIZE, at_chunk=3)}
        cluster = await start_cluster(3, faults=faults)
        try:
            signed = cluster.origin.publish(1, payload())
            for worker in cluster.relays:  # every relay fetched from the origin: each holds the version
                await cluster.fetch(worker, signed, cluster.plan(1, [worker]))
            manifest = signed.unverified_manifest()
            async with aiohttp.ClientSession() as session:
                def ask(worker: str, index: int, headers: dict[str, str] = HEADERS):
                    return check_chunk(session, cluster.relays[worker].url, manifest, index, headers=headers,
                                       timeout_s=5.0)

                assert (await ask("w0", 5))[0] == "good"
                verdict, seen = await ask("w1", 5)
                assert verdict == "bad" and seen.startswith("sha256 ") and manifest.chunk_sha256[5] not in seen
                assert (await ask("w1", 4))[0] == "good"  # its other chunks are genuine
                assert (await ask("w2", 3))[0] == "bad"  # announced longer than the manifest says
                with pytest.raises(ValueError, match="does not exist"):  # the caller refuses such a report
                    await ask("w0", manifest.num_chunks)
                assert await ask("w0", 5, headers={}) == ("unreachable", "HTTP 401")
                url = cluster.relays["w0"].url
                await cluster.relays["w0"].stop()
                gone = await check_chunk(session, url, manifest, 5, headers=HEADERS, timeout_s=5.0)
                assert gone[0] == "unreachable" and "connection failed" in gone[1]
        finally:
            await cluster.stop()

    run(scenario())
