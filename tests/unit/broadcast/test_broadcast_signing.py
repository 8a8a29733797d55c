"""Manifest signatures: only manifests signed by the pinned learner key, newer than what the
worker holds and within limits are accepted; keys round-trip through files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from echo2.broadcast.lab.payload import synthetic_payload
from echo2.broadcast.signing import (
    ManifestRejected,
    generate_private_key,
    key_id,
    load_private_key,
    load_public_key,
    public_key_hex,
    save_private_key,
    save_public_key,
    sign_manifest,
    verify_manifest,
)
from echo2.protocol.manifest import SignedManifest, build_manifest, content_index

KEY = generate_private_key()
PAYLOAD = synthetic_payload(3000, seed=7)


def _signed(version: int = 5, base_version: int | None = None) -> SignedManifest:
    if base_version is None:
        return sign_manifest(build_manifest(version, PAYLOAD, 512), KEY)
    # a delta: the payload's own tensor index stands in for the reconstructed content
    return sign_manifest(build_manifest(version, PAYLOAD, 512, base_version=base_version, codec="sub-zstd",
                                        content=content_index(PAYLOAD), content_bytes=len(PAYLOAD)), KEY)


def test_sign_then_verify_returns_the_manifest() -> None:
    signed = _signed()
    manifest = verify_manifest(signed, KEY.public_key(), held_version=4)
    assert manifest == build_manifest(5, PAYLOAD, 512)
    # what the coordinator forwards is plain JSON, and survives a round trip through it
    again = SignedManifest.model_validate_json(signed.model_dump_json())
    assert verify_manifest(again, KEY.public_key(), held_version=None) == manifest


def test_tampered_manifest_is_rejected() -> None:
    signed = _signed()
    forged = signed.model_copy(update={"manifest_json": signed.manifest_json.replace('"version":5', '"version":6')})
    assert forged.manifest_json != signed.manifest_json
    with pytest.raises(ManifestRejected, match="signature"):
        verify_manifest(forged, KEY.public_key(), held_version=None)


def test_manifest_signed_by_another_key_is_rejected_even_with_our_key_id() -> None:
    other = generate_private_key()
    forged = sign_manifest(build_manifest(5, PAYLOAD, 512), other)
    with pytest.raises(ManifestRejected, match="pinned learner key"):
        verify_manifest(forged, KEY.public_key(), held_version=None)
    relabelled = forged.model_copy(update={"key_id": key_id(KEY.public_key())})
    with pytest.raises(ManifestRejected, match="signature"):
        verify_manifest(relabelled, KEY.public_key(), held_version=None)


@pytest.mark.parametrize("held", [5, 6, 100])
def test_replayed_or_old_version_is_rejected(held: int) -> None:
    with pytest.raises(ManifestRejected, match="not newer"):
        verify_manifest(_signed(5), KEY.public_key(), held_version=held)


def test_delta_needs_its_base_version() -> None:
    assert verify_manifest(_signed(6, base_version=5), KEY.public_key(), held_version=5).base_version == 5
    with pytest.raises(ManifestRejected, match="full snapshot"):
        verify_manifest(_signed(6, base_version=5), KEY.public_key(), held_version=4)


def test_oversized_version_is_rejected_before_fetching() -> None:
    with pytest.raises(ManifestRejected, match="max_payload_bytes"):
        verify_manifest(_signed(), KEY.public_key(), held_version=None, max_payload_bytes=len(PAYLOAD) - 1)


def test_keys_roundtrip_through_files(tmp_path: Path) -> None:
    save_private_key(KEY, tmp_path / "learner.key")
    save_public_key(KEY.public_key(), tmp_path / "learner.pub")
    assert stat.S_IMODE((tmp_path / "learner.key").stat().st_mode) == 0o600
    loaded = load_private_key(tmp_path / "learner.key")
    assert public_key_hex(loaded.public_key()) == public_key_hex(KEY.public_key())
    from_file = load_public_key(tmp_path / "learner.pub")
    from_hex = load_public_key(public_key_hex(KEY.public_key()))
    signed = sign_manifest(build_manifest(1, PAYLOAD, 512), loaded)
    for key in (from_file, from_hex):
        assert verify_manifest(signed, key, held_version=None).version == 1


def test_key_loading_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_private_key(tmp_path / "missing.key")
    with pytest.raises(ValueError, match="neither 64 hex digits nor an existing file"):
        load_public_key(str(tmp_path / "missing.pub"))
    (tmp_path / "short.pub").write_text("abcd")
    with pytest.raises(ValueError, match="32 bytes"):
        load_public_key(tmp_path / "short.pub")
