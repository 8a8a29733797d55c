"""A small private certificate authority for a run's TLS (`echo2 certs`), built on `cryptography`.

The operator makes one CA on a machine they trust, gives its certificate (`ca.pem`, public) to
every role as `tls.ca_file`, and issues one server certificate per machine that serves: the
learner's machine (coordinator and origin) and every worker that runs a relay. Each server
certificate names the hosts and IP addresses peers dial (its subjectAltName), since clients check
the name in the URL against it. Keys are ECDSA P-256: every TLS stack accepts them and they take
milliseconds to make. Private keys are created with mode 0600 and never overwritten in place.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.pem", "ca.key"
# a little slack for peers whose clocks run behind the CA machine's
BACKDATE = datetime.timedelta(hours=1)
_DNS_NAME = re.compile(r"^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Issued:
    cert_path: Path
    key_path: Path
    not_after: datetime.datetime


def subject_alt_names(hosts: list[str]) -> list[x509.GeneralName]:
    """Each host as an IP address entry if it parses as one, else as a DNS name."""
    if not hosts:
        raise ValueError("give at least one --host: the name or IP address peers use to reach this machine")
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not _DNS_NAME.match(host) or len(host) > 253:
                raise ValueError(f"--host {host!r} is neither an IP address nor a DNS name "
                                 "(letters, digits, '-' and '.', e.g. worker3.example.org or 10.0.0.7)") from None
            names.append(x509.DNSName(host.lower()))
    return names


def make_ca(out_dir: Path, *, common_name: str = "echo2 CA", days: int = 3650, force: bool = False) -> Issued:
    """Write `out_dir/ca.pem` (give to every role) and `out_dir/ca.key` (mode 0600, keep it here)."""
    _check_days(days)
    cert_path, key_path = out_dir / CA_CERT, out_dir / CA_KEY
    _refuse_overwrite([cert_path, key_path], force)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "echo2")])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        _validity(now, now + datetime.timedelta(days=days))
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        # path_length 0: this CA signs server certificates only, never another CA
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    cert = builder.sign(key, hashes.SHA256())
    _write_key(key_path, key, force)
    _write_public(cert_path, cert)
    return Issued(cert_path, key_path, cert.not_valid_after_utc)


def issue(ca_dir: Path, name: str, hosts: list[str], *, out_dir: Path | None = None, days: int = 825,
          force: bool = False) -> Issued:
    """Sign a server certificate for `hosts` with the CA in `ca_dir`; writes `<name>.pem` and
    `<name>.key` (mode 0600). 825 days: the longest server certificate lifetime clients such as Apple's still accept."""
    if not _FILE_NAME.match(name) or name.startswith("ca."):
        raise ValueError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it names the files), not 'ca.*'")
    _check_days(days)
    alt_names = subject_alt_names(hosts)
    ca_cert, ca_key = load_ca(ca_dir)
    out_dir = out_dir or ca_dir
    cert_path, key_path = out_dir / f"{name}.pem", out_dir / f"{name}.key"
    _refuse_overwrite([cert_path, key_path], force)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    # never past the CA's own end: clients would refuse the chain from then on anyway
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    builder = (
        _validity(now, not_after)
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(key_path, key, force)
    _write_public(cert_path, cert)
    return Issued(cert_path, key_path, not_after)


def load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    for path in (cert_path, key_path):
        if not path.is_file():
            raise ValueError(f"{path} does not exist: make the CA first with `echo2 certs ca --out {ca_dir}`")
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise ValueError(f"{key_path} is not the private key of {cert_path}: were they made together?")
    return cert, key


def _validity(now: datetime.datetime, not_after: datetime.datetime) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(not_after))


def _check_days(days: int) -> None:
    if days < 1:
        raise ValueError(f"--days {days}: a certificate must be valid for at least 1 day")


def _refuse_overwrite(paths: list[Path], force: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise ValueError(f"{', '.join(existing)} already exist(s); pass --force to replace (peers holding the old "
                         "certificate or CA then need the new one)")


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, force: bool) -> None:
    """PKCS#8 PEM, created with mode 0600 (O_EXCL: never an existing file with looser permissions)."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    if force:
        path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)


def _write_public(path: Path, cert: x509.Certificate) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
