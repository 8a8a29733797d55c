"""Manifest signatures: the learner signs every version's manifest with an Ed25519 key; workers
verify it against the learner's public key pinned in their config before fetching a byte.

The signature covers the exact encoded manifest bytes carried in `SignedManifest.manifest_json`
(prefixed with a domain tag), and a worker parses those bytes only after the signature checks,
so no re-encoding can make signer and verifier disagree. Keys are stored as files: the private
key as unencrypted PKCS#8 PEM readable by its owner only, the public key as 64 hex characters
(the form a config file pins).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from echo2.protocol.manifest import Manifest, SignedManifest, decode_manifest, encode_manifest

_DOMAIN = b"echo2-manifest-v1\n"
"""Signed prefix: a signature over a manifest can never be replayed as one over another message."""


class ManifestRejected(ValueError):
    """A manifest a worker must not act on: bad signature, wrong key, not newer, too large."""


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def key_id(public_key: Ed25519PublicKey) -> str:
    """Short fingerprint: first 16 hex digits of the sha256 of the raw public key."""
    return hashlib.sha256(public_key_hex(public_key).encode()).hexdigest()[:16]


def public_key_hex(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw.hex()


def public_key_from_hex(text: str) -> Ed25519PublicKey:
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"public key {text[:80]!r} is not hex; expected 64 hex digits") from None
    if len(raw) != 32:
        raise ValueError(f"public key has {len(raw)} bytes; an Ed25519 public key is 64 hex digits (32 bytes)")
    return Ed25519PublicKey.from_public_bytes(raw)


def save_private_key(key: Ed25519PrivateKey, path: str | Path) -> None:
    """Write PKCS#8 PEM with mode 0600 (created that way, never world-readable in between)."""
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)


def private_key_bytes(key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte secret, for deriving other per-learner secrets from it."""
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"private key file {str(path)!r} does not exist; create one with save_private_key")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"private key file {str(path)!r} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def save_public_key(key: Ed25519PublicKey, path: str | Path) -> None:
    Path(path).write_text(public_key_hex(key) + "\n")


def load_public_key(path_or_hex: str | Path) -> Ed25519PublicKey:
    """A public key from a file written by `save_public_key`, or the 64 hex digits themselves."""
    text = str(path_or_hex)
    if len(text.strip()) == 64 and not Path(text).exists():
        return public_key_from_hex(text)
    path = Path(path_or_hex)
    if not path.is_file():
        raise ValueError(f"public key {text!r} is neither 64 hex digits nor an existing file")
    return public_key_from_hex(path.read_text())


def sign_manifest(manifest: Manifest, private_key: Ed25519PrivateKey) -> SignedManifest:
    manifest_json = encode_manifest(manifest).decode()
    signature = private_key.sign(_DOMAIN + manifest_json.encode())
    return SignedManifest(
        manifest_json=manifest_json, signature_hex=signature.hex(), key_id=key_id(private_key.public_key())
    )


def verify_manifest(
    signed: SignedManifest,
    public_key: Ed25519PublicKey,
    *,
    held_version: int | None,
    max_payload_bytes: int | None = None,
    check_base: bool = True,
) -> Manifest:
    """The manifest, if signed by `public_key`, newer than `held_version` and within size limits.

    Raises ManifestRejected otherwise. A delta (base_version set) is accepted only by a worker
    holding exactly its base version (`check_base`; off for the coordinator, which holds none).
    """
    _check_signature(signed, public_key)
    manifest = decode_manifest(signed.manifest_json)
    if held_version is not None and manifest.version <= held_version:
        raise ManifestRejected(
            f"manifest version {manifest.version} is not newer than held version {held_version} (replay?)"
        )
    if check_base and manifest.base_version is not None and manifest.base_version != held_version:
        raise ManifestRejected(
            f"version {manifest.version} is a delta against {manifest.base_version} but this worker holds "
            f"{held_version}; it needs a full snapshot"
        )
    if max_payload_bytes is not None and max(manifest.total_bytes, manifest.loaded_bytes) > max_payload_bytes:
        raise ManifestRejected(
            f"version {manifest.version} has {max(manifest.total_bytes, manifest.loaded_bytes)} bytes, "
            f"above max_payload_bytes {max_payload_bytes}; raise broadcast.max_payload_bytes if this model is expected"
        )
    return manifest


def _check_signature(signed: SignedManifest, public_key: Ed25519PublicKey) -> None:
    expected_id = key_id(public_key)
    if signed.key_id != expected_id:
        raise ManifestRejected(f"manifest signed by key {signed.key_id}, but the pinned learner key is {expected_id}")
    try:
        public_key.verify(bytes.fromhex(signed.signature_hex), _DOMAIN + signed.manifest_json.encode())
    except (InvalidSignature, ValueError):
        raise ManifestRejected(f"manifest signature does not verify with learner key {expected_id}") from None
