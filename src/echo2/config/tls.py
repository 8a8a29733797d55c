"""Schema of one role's TLS settings (`[tls]` of a run, `tls` of a worker): which certificate its
servers present and which CA the servers it calls must chain to. Only file paths live here; the
private key is read from its file when a server starts and is never copied into a config."""

from __future__ import annotations

import os

from pydantic import field_validator, model_validator

from echo2.config.base import Frozen


class TLSConfig(Frozen):
    cert_file: str = ""
    """PEM server certificate this role's servers present (the coordinator and the learner's
    origin for a run's `[tls]`, the relay for a worker's `tls`), e.g. from `echo2 certs issue`.
    Its names (subjectAltName) must include every host or IP address peers dial. Empty: plain
    HTTP, with a warning when a server binds a non-loopback address."""
    key_file: str = ""
    """PEM private key of `cert_file`, unencrypted. Checked when the server starts: a key file
    other users on the machine may read or write (any "other" permission bit) is refused;
    `echo2 certs` writes keys with mode 0600."""
    ca_file: str = ""
    """PEM CA certificate(s) the https:// servers this role calls must chain to: `ca.pem` from
    `echo2 certs ca`. Empty: the system's trust store (servers with publicly trusted
    certificates). Plain http:// URLs are still allowed, with a warning unless on loopback."""

    @field_validator("cert_file", "key_file", "ca_file")
    @classmethod
    def _absolute(cls, value: str) -> str:
        """Relative paths are taken from the directory the config is read in, and stored
        absolute, so the child processes of `echo2 run` find the same files."""
        return os.path.abspath(os.path.expanduser(value)) if value else ""

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> TLSConfig:
        if bool(self.cert_file) != bool(self.key_file):
            given, missing = ("cert_file", "key_file") if self.cert_file else ("key_file", "cert_file")
            raise ValueError(f"tls.{given} is set but tls.{missing} is not: a server needs both "
                             "(`echo2 certs issue` writes NAME.pem and NAME.key)")
        return self

    @property
    def serves(self) -> bool:
        """True when this role's servers speak https."""
        return bool(self.cert_file)
