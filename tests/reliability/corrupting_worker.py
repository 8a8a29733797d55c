"""A hostile relay for reliability tests and the chaos benchmark: the real `echo2 worker`
(honest rollouts), except that its relay flips a byte in every chunk it serves from chunk 0 on,
as a relay poisoning its children's weights would. Its children must verify, fail over and report
it. Run it as `python -m tests.reliability.corrupting_worker --coordinator URL ...`."""

from __future__ import annotations

import sys

import echo2.rollout.weights as weights_module
from echo2.broadcast.faults import Fault, FaultKind
from echo2.broadcast.relay import RelayServer
from echo2.cli import main


class CorruptingRelay(RelayServer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, fault=Fault(FaultKind.CORRUPT, at_chunk=0), **kwargs)


if __name__ == "__main__":
    weights_module.RelayServer = CorruptingRelay
    sys.exit(main(["worker", *sys.argv[1:]]))
