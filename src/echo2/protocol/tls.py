"""TLS for every echo2 HTTP server (coordinator, origin, relays) and client (workers, learner):
ssl contexts from a `TLSConfig`, the warning for plain HTTP off loopback, and handshake failures
turned into one message that names the URL, what failed and how to fix it.

What is verified: a client calling an https:// URL checks that the server's certificate chains
to `tls.ca_file` (or the system trust store) and names the URL's host; servers do not ask
clients for certificates (clients prove their role with bearer tokens, now sent encrypted).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
import stat

import aiohttp
import yarl
from cryptography import x509

from echo2.config.tls import TLSConfig

log = logging.getLogger("echo2.tls")
_warned: set[tuple[str, str]] = set()  # (what, host): one warning each per process, not per request

# OpenSSL verify codes with a fix of their own (X509_V_ERR_*)
_UNTRUSTED = {2, 18, 19, 20, 21}  # unknown issuer, self-signed: the client holds another CA
_EXPIRED = {9, 10}  # not yet valid, expired
_HOSTNAME_MISMATCH = {62, 64}  # the URL's host is not among the certificate's names
_WILDCARDS = ("0.0.0.0", "::", "")


class TLSError(ValueError):
    """A TLS handshake failed. Retrying cannot help: a certificate or URL must change first."""


def server_context(tls: TLSConfig) -> ssl.SSLContext | None:
    """The context this role's servers serve with; None (plain HTTP) when no certificate is set."""
    if not tls.serves:
        return None
    check_key_file(tls.key_file)
    _check_not_expired(tls.cert_file)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        # a password callback returning nothing: an encrypted key fails here instead of
        # prompting on a terminal a background process does not have
        context.load_cert_chain(tls.cert_file, tls.key_file, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"tls.cert_file={tls.cert_file!r} with tls.key_file={tls.key_file!r} could not be "
                         f"loaded ({exc}): they must be a PEM certificate and its unencrypted PEM key, made "
                         "together (e.g. by `echo2 certs issue`)") from None
    return context


def client_context(tls: TLSConfig) -> ssl.SSLContext:
    """Verifies https:// servers against `tls.ca_file` (the system's trust store when empty)."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file or None)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"tls.ca_file={tls.ca_file!r} could not be loaded ({exc}): it must be a PEM CA "
                         "certificate, e.g. ca.pem from `echo2 certs ca`") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def connector(tls: TLSConfig) -> aiohttp.TCPConnector:
    """A client session's connector: https:// URLs verified as `client_context` says."""
    return aiohttp.TCPConnector(ssl=client_context(tls))


def check_key_file(path: str) -> None:
    """Refuse a private key other users on this machine may read or write. Group access is
    allowed (Debian's ssl-cert group convention: mode 0640); `echo2 certs` writes 0600."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ValueError(f"tls.key_file={path!r} cannot be read ({exc.strerror})") from None
    if mode & stat.S_IRWXO:
        raise ValueError(f"tls.key_file={path!r} is accessible to every user on this machine (mode "
                         f"{stat.S_IMODE(mode):04o}); run `chmod 600 {path}` (and replace the key if others "
                         "may have copied it)")


def base_url(host: str, port: int, tls: bool) -> str:
    """A server's URL as peers are told it: the scheme says whether they must speak TLS. A
    wildcard bind address is not one a client can name (nor a certificate): it becomes
    127.0.0.1, where a client on the same machine reaches the server."""
    host = "127.0.0.1" if host in _WILDCARDS else f"[{host}]" if ":" in host else host  # IPv6 in brackets
    return f"{'https' if tls else 'http'}://{host}:{port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_plain_bind(host: str, what: str) -> None:
    """A server without TLS on an address other machines can reach: tokens and weights travel
    unencrypted."""
    if not is_loopback(host) and (what, host) not in _warned:
        _warned.add((what, host))
        log.warning("%s serves plain HTTP on %s, reachable from other machines: bearer tokens and weights "
                    "travel unencrypted. Set tls.cert_file and tls.key_file (see `echo2 certs`).", what, host or "*")


def warn_plain_url(url: str, what: str) -> None:
    """A client about to call a non-loopback http:// URL."""
    parsed = yarl.URL(url)
    host = parsed.host or ""
    local = is_loopback(host) or host in _WILDCARDS  # dialing a wildcard address reaches this machine
    if parsed.scheme == "http" and not local and (what, host) not in _warned:
        _warned.add((what, host))
        log.warning("calling %s at %s over plain HTTP: bearer tokens and weights travel unencrypted. "
                    "Serve it with TLS and use an https:// URL.", what, url)


def describe_failure(url: str, exc: aiohttp.ClientSSLError) -> str:
    """What a failed handshake with `url` means and what to change."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        error = exc.certificate_error
        reason = (getattr(error, "verify_message", "") or str(error)).rstrip(".")
        code = getattr(error, "verify_code", None)
        if code in _HOSTNAME_MISMATCH:
            fix = (f"the certificate does not name {yarl.URL(url).host!r}: issue one that does "
                   "(`echo2 certs issue --name NAME --host HOST ...`), or reach the server by a name it has")
        elif code in _EXPIRED:
            fix = "the server's certificate is expired or not yet valid: issue a new one (`echo2 certs issue`)"
        elif code in _UNTRUSTED:
            fix = ("set tls.ca_file to the CA that signed the server's certificate (ca.pem of `echo2 certs ca`); "
                   "this client trusts another CA")
        else:
            fix = "check the server's certificate and this client's tls.ca_file"
        return f"{url}: TLS certificate verification failed: {reason}. Fix: {fix}"
    return (f"{url}: TLS handshake failed ({exc.os_error}). "
            "Fix: if the server serves plain HTTP use an http:// URL (or give the server tls.cert_file and "
            "tls.key_file)")


def _check_not_expired(cert_file: str) -> None:
    """Clients would refuse an expired certificate one by one; say it once, at start."""
    try:
        cert = x509.load_pem_x509_certificate(open(cert_file, "rb").read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"tls.cert_file={cert_file!r} is not a readable PEM certificate ({exc})") from None
    now = datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ValueError(f"tls.cert_file={cert_file!r} is valid from {cert.not_valid_before_utc:%Y-%m-%d} to "
                         f"{cert.not_valid_after_utc:%Y-%m-%d}, not now: issue a new one (`echo2 certs issue`)")
