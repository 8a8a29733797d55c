"""`echo2 certs`: the CA and the server certificates it issues parse, carry the names peers dial,
chain to the CA under strict X.509 checks, and their private keys are owner-only files that are
never silently replaced."""

from __future__ import annotations

import ipaddress
import ssl
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from echo2.cli import main
from echo2.protocol import certs


def _cert(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_a_worker_certificate_names_its_hosts_and_chains_to_the_ca(tmp_path, capsys):
    assert main(["certs", "ca", "--out", str(tmp_path)]) == 0
    assert main(["certs", "issue", "--ca-dir", str(tmp_path), "--name", "worker-3", "--host", "10.0.0.7",
                 "--host", "Worker3.Example.org", "--host", "::1"]) == 0
    out = capsys.readouterr().out
    for name in ("ca.pem", "ca.key", "worker-3.pem", "worker-3.key"):
        assert f"wrote {tmp_path / name}" in out
    assert f"--set tls.cert_file={tmp_path / 'worker-3.pem'}" in out and f"tls.ca_file={tmp_path / 'ca.pem'}" in out

    ca, leaf = _cert(tmp_path / "ca.pem"), _cert(tmp_path / "worker-3.pem")
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7"), ipaddress.ip_address("::1")]
    assert names.get_values_for_type(x509.DNSName) == ["worker3.example.org"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH])
    assert leaf.not_valid_after_utc <= ca.not_valid_after_utc
    for key_file, cert in (("ca.key", ca), ("worker-3.key", leaf)):
        path = tmp_path / key_file
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        assert key.public_key() == cert.public_key()
    # OpenSSL's strict mode (the default from Python 3.13) accepts the chain and the key pair
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "worker-3.pem", tmp_path / "worker-3.key")
    assert _handshake(client, server, "10.0.0.7") is None
    assert "mismatch" in _handshake(client, server, "10.0.0.8")


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, hostname: str) -> str | None:
    """A TLS handshake in memory; None on success, else the client's verification error."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as exc:
                return exc.verify_message
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if c.version() and s.version():
            return None
    raise AssertionError("handshake did not finish")


def test_existing_files_are_not_replaced_without_force(tmp_path, capsys):
    certs.make_ca(tmp_path)
    first = (tmp_path / "ca.key").read_bytes()
    assert main(["certs", "ca", "--out", str(tmp_path)]) == 2
    assert "already exist" in capsys.readouterr().err and (tmp_path / "ca.key").read_bytes() == first
    (tmp_path / "ca.key").chmod(0o644)  # loosened by hand: --force must not keep the loose mode
    assert main(["certs", "ca", "--out", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "ca.key").read_bytes() != first and stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    certs.issue(tmp_path, "learner", ["localhost"])
    with pytest.raises(ValueError, match="already exist"):
        certs.issue(tmp_path, "learner", ["localhost"])


@pytest.mark.parametrize(("args", "message"), [
    (["--name", "w", "--host", "a b"], "'a b' is neither an IP address nor a DNS name"),
    (["--name", "w"], "give at least one --host"),
    (["--name", "../w", "--host", "h"], "names the files"),
    (["--name", "w", "--host", "h", "--days", "0"], "at least 1 day"),
])
def test_bad_issue_arguments_are_named(tmp_path, capsys, args, message):
    certs.make_ca(tmp_path)
    assert main(["certs", "issue", "--ca-dir", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.key", "ca.pem"]


def test_issuing_without_a_ca_says_how_to_make_one(tmp_path, capsys):
    assert main(["certs", "issue", "--ca-dir", str(tmp_path / "none"), "--name", "w", "--host", "h"]) == 2
    assert "echo2 certs ca --out" in capsys.readouterr().err
