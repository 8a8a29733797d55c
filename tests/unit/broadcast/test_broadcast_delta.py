"""Delta versions: a worker rebuilds every version bit for bit from the one it holds (after k
deltas, after missing versions, as a late joiner from an anchor), and refuses a delta that does
not rebuild what the manifest's tensor hashes say."""

from __future__ import annotations

import mmap

import pytest
import torch

from echo2.broadcast.catchup import ServedForm, cheapest_path, path_bytes, retained
from echo2.broadcast.delta import decode_delta, encode_delta, same_layout
from echo2.broadcast.encoder import VersionEncoder
from echo2.config.broadcast import BroadcastConfig
from echo2.models.weights import plan_layout, write_payload
from echo2.protocol.manifest import build_manifest, verify_content


def _payload(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> memoryview:
    layout = plan_layout(tensors, dtype)
    buffer = mmap.mmap(-1, layout.total_bytes)
    write_payload(layout, buffer)
    return memoryview(buffer).toreadonly()


def _versions(count: int, dtype: torch.dtype = torch.bfloat16, lr: float = 1e-5) -> list[memoryview]:
    """Payloads of `count` versions of a small model trained with Adam-sized steps (each weight
    moves by ~lr a step, as at RL learning rates), fp32 masters cast to the wire dtype."""
    gen = torch.Generator().manual_seed(0)
    master = {"embed": torch.randn(300, 64, generator=gen) * 0.02, "norm": torch.ones(64),
              "proj": torch.randn(64, 96, generator=gen) * 0.02, "empty": torch.zeros(0), "step": torch.tensor([0])}
    out = []
    for _ in range(count):
        out.append(_payload(master, dtype))
        for tensor in master.values():
            if tensor.is_floating_point():
                tensor += lr * torch.sign(torch.randn(tensor.shape, generator=gen))
        master["step"] += 1
    return out


def _manifest(version: int, form) -> object:
    return build_manifest(version, form.payload, 4096, base_version=form.base_version, codec=form.codec,
                          content=form.content, content_bytes=form.content_bytes)


def _publish(payloads: list[memoryview], **config) -> dict[tuple[int, str], tuple[object, object]]:
    """What a learner publishes: (version, form) -> (manifest, encoded form)."""
    encoder = VersionEncoder(BroadcastConfig(deltas=True, **config))
    published = {}
    for version, payload in enumerate(payloads):
        for form in encoder.encode(version, payload):
            manifest = _manifest(version, form)
            published[version, manifest.form] = (manifest, form)
    return published


def _rebuild(held: memoryview | None, path, published) -> memoryview:
    """A worker following `path`: every step verified against its manifest's tensor hashes."""
    for offer in path:
        manifest, form = published[offer.version, offer.form]
        if manifest.base_version is None:
            held = memoryview(bytes(form.payload))
        else:
            held = decode_delta(held, form.payload, codec=manifest.codec)
            verify_content(manifest, held)
    return held


def _offers(published) -> list[ServedForm]:
    return [ServedForm(v, m.base_version, m.total_bytes) for (v, _), (m, _) in published.items()]


@pytest.mark.parametrize("codec", ["sub-zstd", "xor-zstd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_k_deltas_rebuild_every_version_bit_identical(codec: str, dtype: torch.dtype) -> None:
    payloads = _versions(6, dtype)
    published = _publish(payloads, delta_codec=codec, anchor_every=1000)
    held = payloads[0]
    for version in range(1, 6):
        manifest, form = published[version, "delta"]
        assert (version, "full") not in published  # no anchor: deltas only
        # bf16 rounds most steps away; fp32 keeps every step's low mantissa bits
        assert manifest.total_bytes < len(payloads[version]) * (0.3 if dtype == torch.bfloat16 else 0.7)
        held = decode_delta(held, form.payload, codec=codec)
        verify_content(manifest, held)
        assert bytes(held) == bytes(payloads[version])


def test_a_worker_that_missed_versions_takes_the_deltas_it_missed() -> None:
    payloads = _versions(6)
    published = _publish(payloads, anchor_every=1000)
    path = cheapest_path(2, 5, _offers(published))
    assert [(o.version, o.form) for o in path] == [(3, "delta"), (4, "delta"), (5, "delta")]
    assert bytes(_rebuild(payloads[2], path, published)) == bytes(payloads[5])


def test_a_late_joiner_takes_the_newest_anchor_and_the_deltas_after_it() -> None:
    payloads = _versions(8)
    published = _publish(payloads, anchor_every=3)
    assert {v for v, f in published if f == "full"} == {0, 3, 6}  # the first version, then every 3rd
    path = cheapest_path(None, 7, _offers(published))
    assert [(o.version, o.form) for o in path] == [(6, "full"), (7, "delta")]
    assert bytes(_rebuild(None, path, published)) == bytes(payloads[7])


def test_a_delta_applied_to_the_wrong_base_is_refused() -> None:
    payloads = _versions(4)
    published = _publish(payloads, anchor_every=1000)
    manifest, form = published[3, "delta"]
    wrong = decode_delta(payloads[1], form.payload, codec=manifest.codec)  # decodes: same layout
    with pytest.raises(ValueError, match="fails its sha256 after reconstruction from base version 2"):
        verify_content(manifest, wrong)


def test_a_corrupted_delta_is_refused() -> None:
    payloads = _versions(3)
    published = _publish(payloads, anchor_every=1000)
    manifest, form = published[2, "delta"]
    good = bytes(form.payload)
    flipped = bytearray(good)
    flipped[-3] ^= 0x40  # inside the last zstd frame
    with pytest.raises(ValueError):
        verify_content(manifest, decode_delta(payloads[1], bytes(flipped), codec=manifest.codec))
    with pytest.raises(ValueError, match="delta blocks cover"):
        decode_delta(payloads[1], good[:-1], codec=manifest.codec)
    with pytest.raises(ValueError, match="header is malformed"):
        decode_delta(payloads[1], good[:8] + b"[" + good[9:], codec=manifest.codec)
    with pytest.raises(ValueError, match="says codec"):
        decode_delta(payloads[1], good, codec="xor-zstd")
    smaller = _payload({"x": torch.zeros(4)}, torch.bfloat16)
    with pytest.raises(ValueError, match="wrong base"):
        decode_delta(smaller, good, codec=manifest.codec)


def test_a_layout_change_gets_a_full_version() -> None:
    encoder = VersionEncoder(BroadcastConfig(deltas=True, anchor_every=1000))
    first = _payload({"a": torch.zeros(8)}, torch.bfloat16)
    grown = _payload({"a": torch.zeros(9)}, torch.bfloat16)
    assert not same_layout(first, grown)
    with pytest.raises(ValueError, match="differ in layout"):
        encode_delta(first, grown)
    assert [f.base_version for f in encoder.encode(0, first)] == [None]
    assert [f.base_version for f in encoder.encode(1, grown)] == [None]
    assert [f.base_version for f in encoder.encode(2, grown)] == [1]


def test_anchors_every_k_on_request_and_never_with_deltas_off() -> None:
    payload = _payload({"a": torch.zeros(8)}, torch.bfloat16)
    encoder = VersionEncoder(BroadcastConfig(deltas=True, anchor_every=4))
    forms = {v: [f.base_version for f in encoder.encode(v, payload)] for v in range(6)}
    assert forms == {0: [None], 1: [0], 2: [1], 3: [2], 4: [3, None], 5: [4]}
    encoder.anchor_requested = True
    assert [f.base_version for f in encoder.encode(6, payload)] == [5, None]
    assert [f.base_version for f in encoder.encode(7, payload)] == [6]
    off = VersionEncoder(BroadcastConfig())
    assert [[f.base_version for f in off.encode(v, payload)] for v in range(3)] == [[None]] * 3


def test_cheapest_path_prefers_an_anchor_when_the_missed_deltas_cost_more() -> None:
    offers = [ServedForm(0, None, 100), *(ServedForm(v, v - 1, 30) for v in range(1, 8)), ServedForm(6, None, 100)]
    assert [o.version for o in cheapest_path(1, 7, offers)] == [6, 7]  # 100 + 30 beats 6 x 30
    assert [o.version for o in cheapest_path(4, 7, offers)] == [5, 6, 7]  # 90 beats 130
    assert path_bytes(cheapest_path(None, 7, offers)) == 130
    assert cheapest_path(7, 7, offers) is None  # nothing newer to fetch
    gap = [ServedForm(3, 2, 10), ServedForm(4, 3, 10)]
    assert cheapest_path(1, 4, gap) is None  # delta 2 is gone and no anchor follows


def test_the_origin_keeps_every_version_since_its_newest_anchor() -> None:
    keys = [(0, "full"), (1, "delta"), (2, "delta"), (2, "full"), (3, "delta"), (4, "delta")]
    assert retained(keys, 2) == {(2, "delta"), (2, "full"), (3, "delta"), (4, "delta")}
    assert retained(keys, 2, since_anchor=False) == {(3, "delta"), (4, "delta")}
    assert retained([(v, "full") for v in range(5)], 2) == {(3, "full"), (4, "full")}
