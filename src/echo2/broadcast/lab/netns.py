"""Linux network namespaces joined by veth pairs through a bridge, each host's link shaped with
`tc ... tbf` in both directions: a small WAN-like lab on one machine (root only).

Layout: a hub namespace holds bridge br0; host i gets its own namespace with eth0 = 10.77.0.(i+2),
joined to br0 by a veth pair created directly between the two namespaces (nothing is added to
the root namespace). Egress of the host's eth0 is shaped to its uplink, egress of the hub-side
end to its downlink. A host may refuse incoming connections, as one behind NAT does. Every
namespace created is deleted on exit, also on failure; names carry a prefix and this process's
pid so concurrent labs never collide.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

SUBNET = "10.77.0"
TBF_BURST = "256kb"
"""tbf bucket: above rate/HZ at these rates and above a 64 KiB GSO segment, as DESIGN.md suggests."""
TBF_LATENCY = "50ms"
"""Queue limit of the shaper: enough to keep a TCP flow busy without bufferbloat."""
COMMAND_TIMEOUT_S = 20.0
"""One `ip`/`tc` call normally takes milliseconds; a loaded 2-core box may take a second or two."""


@dataclass(frozen=True)
class HostSpec:
    name: str
    up_bits_per_s: float | None
    """Uplink shaping (None: unshaped)."""
    down_bits_per_s: float | None
    accepts_incoming: bool = True
    """False: connections to this host are never set up (its SYN-ACKs are dropped), while its own
    connections go out as usual: a host behind NAT."""


def netns_unavailable_reason() -> str | None:
    """Why a network-namespace lab cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"iproute2 tools missing: {', '.join(missing)}"
    probe = f"e2probe{os.getpid()}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if result.returncode != 0:
        return f"cannot create a network namespace: {result.stderr.strip()}"
    _run(["ip", "netns", "del", probe])
    return None


class LabNetwork:
    def __init__(self, hosts: list[HostSpec], prefix: str = "e2l") -> None:
        """`prefix` starts every namespace name: tests that list their own namespaces use their own."""
        if len(hosts) > 250:
            raise ValueError(f"{len(hosts)} hosts; the lab subnet holds at most 250")
        self.hosts = hosts
        self.tag = f"{prefix}{os.getpid()}"
        self.hub = f"{self.tag}-hub"
        self._created: list[str] = []

    def namespace(self, index: int) -> str:
        return f"{self.tag}-h{index}"

    def ip(self, index: int) -> str:
        return f"{SUBNET}.{index + 2}"

    def exec_prefix(self, index: int) -> list[str]:
        """Prefix a command with this to run it inside host `index`'s namespace (same PID: ip execs)."""
        return ["ip", "netns", "exec", self.namespace(index)]

    def __enter__(self) -> LabNetwork:
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def destroy(self) -> None:
        """Delete every namespace this lab created (their veths and qdiscs go with them)."""
        errors = []
        while self._created:
            name = self._created.pop()
            result = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True,
                                    timeout=COMMAND_TIMEOUT_S)
            if result.returncode != 0:
                errors.append(f"{name}: {result.stderr.strip()}")
        if errors:
            raise RuntimeError("could not delete lab namespaces: " + "; ".join(errors))

    def _create(self) -> None:
        self._add_namespace(self.hub)
        _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        for index, host in enumerate(self.hosts):
            self._add_host(index, host)

    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _add_host(self, index: int, host: HostSpec) -> None:
        ns, hub_end = self.namespace(index), f"h{index}"
        self._add_namespace(ns)
        _run(["ip", "-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "-n", self.hub, "link", "set", hub_end, "master", "br0"])
        _run(["ip", "-n", self.hub, "link", "set", hub_end, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{self.ip(index)}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _shape(ns, "eth0", host.up_bits_per_s, refuse_incoming=not host.accepts_incoming)
        _shape(self.hub, hub_end, host.down_bits_per_s)


def _shape(namespace: str, device: str, bits_per_s: float | None, refuse_incoming: bool = False) -> None:
    tc = ["ip", "netns", "exec", namespace, "tc"]
    parent = ["root"]
    if bits_per_s is not None:
        _run([*tc, "qdisc", "add", "dev", device, "root", "handle", "1:", "tbf", "rate", f"{int(bits_per_s)}bit",
              "burst", TBF_BURST, "latency", TBF_LATENCY])
        parent = ["parent", "1:1"]
    if refuse_incoming:
        _drop_syn_acks(tc, device, parent)


def _drop_syn_acks(tc: list[str], device: str, parent: list[str]) -> None:
    """Send this host's outgoing SYN-ACKs (the answer to a connection attempt) into a queue that
    holds nothing, so no connection to it is ever set up. This kernel has no iptables and no tc
    actions: an htb class (classes only shape at 10 Gbit/s, the tbf above does the shaping) with
    a zero-length pfifo does the dropping. The u32 match reads the TCP flags at byte 33 (a
    20-byte IP header, as this host's own packets have)."""
    _run([*tc, "qdisc", "add", "dev", device, *parent, "handle", "10:", "htb", "default", "1", "r2q", "100000"])
    for minor in ("1", "2"):
        _run([*tc, "class", "add", "dev", device, "parent", "10:", "classid", f"10:{minor}", "htb", "rate", "10gbit"])
    _run([*tc, "qdisc", "add", "dev", device, "parent", "10:2", "pfifo", "limit", "0"])
    _run([*tc, "filter", "add", "dev", device, "parent", "10:", "protocol", "ip", "prio", "1", "u32",
          "match", "ip", "protocol", "6", "0xff", "match", "u8", "0x12", "0x12", "at", "33", "flowid", "10:2"])


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
