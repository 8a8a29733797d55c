"""The seams fakes must satisfy (echo2.protocol.links): every class under tests/ that declares
LearnerLink or WorkerLink (FakeIO, StepIO, ...), and every real link (LearnerIO,
CoordinatorLink), matches its Protocol signature by signature (tests/unit/seams.py). The
checker's own tests feed it deliberately broken links, one break each, and assert it names the
break: a check that cannot fail is no check."""

from __future__ import annotations

import importlib
import typing
from pathlib import Path

import pytest
from tests.unit.learner_fakes import FakeIO
from tests.unit.seams import declared_implementations, mismatches

from echo2.learner.io import LearnerIO
from echo2.protocol.http import TransientError
from echo2.protocol.links import LearnerLink, WorkerLink
from echo2.protocol.messages import TrainGroup
from echo2.rollout.link import CoordinatorLink

if typing.TYPE_CHECKING:
    import aiohttp
    from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS: dict[str, type] = {"LearnerLink": LearnerLink, "WorkerLink": WorkerLink}
REAL = [(LearnerLink, LearnerIO), (WorkerLink, CoordinatorLink)]
# the deliberately broken links below declare the Protocols too: the checker's tests, not fakes
DECLARED = [(path, name) for path, name in declared_implementations(ROOT / "tests", PROTOCOLS)
            if path != Path(__file__).resolve()]


def _load(path: Path, name: str) -> type:
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert hasattr(module, name), f"{path}: {name} is not at module level (define fakes there so this test sees them)"
    return getattr(module, name)


def _protocol_of(cls: type) -> type:
    [protocol] = [p for p in PROTOCOLS.values() if p in cls.__mro__]
    return protocol


@pytest.mark.parametrize(("path", "name"), DECLARED, ids=[f"{p.stem}.{n}" for p, n in DECLARED])
def test_every_fake_declaring_a_link_matches_its_protocol(path, name):
    cls = _load(path, name)
    problems = mismatches(_protocol_of(cls), cls)
    assert not problems, "\n".join(problems)


def test_the_learner_fakes_are_found():
    """Guards the discovery: a walk that found nothing would pass the test above vacuously."""
    assert {"FakeIO", "StepIO"} <= {name for _, name in DECLARED}


@pytest.mark.parametrize(("protocol", "cls"), REAL, ids=[cls.__name__ for _, cls in REAL])
def test_the_real_links_match_their_protocols(protocol, cls):
    problems = mismatches(protocol, cls)
    assert not problems, "\n".join(problems)


# ---- the checker has teeth: one break each ----

class PlainWorkerLink:
    """A structural WorkerLink (declares nothing): the baseline the breaks below start from."""

    session: aiohttp.ClientSession | None = None

    async def once(self, method: str, path: str, body: BaseModel | None, *, timeout_s: float,
                   token: str | None = None) -> str:
        return ""

    async def retrying(self, method: str, path: str, body: BaseModel | None, *, token: str | None = None) -> str:
        return ""

    def check_reachable(self, exc: TransientError, *, next_try_s: float) -> None:
        pass


class RenamedKeyword(FakeIO):
    def fetch_batch(self, step: int, *, wait: float, step_time_s: float | None = None,
                    durable_step: int | None = None) -> list[TrainGroup]:
        return []


class PositionalWait(FakeIO):
    def fetch_batch(self, step: int, wait_s: float, step_time_s: float | None = None,
                    durable_step: int | None = None) -> list[TrainGroup]:
        return []


class DroppedDefault(FakeIO):
    def reject_batch(self, step: int, reason: str, requeue_lease_ids: tuple[str, ...]) -> None:
        pass


class WrongReturn(FakeIO):
    def origin_bytes_sent(self, version: int) -> float:
        return 0.0


class Unannotated(FakeIO):
    def report_audit(self, step, verdicts) -> None:
        pass


class GrownLearnerLink(LearnerLink, typing.Protocol):
    """The seam after it grew a method and an attribute the fakes have not caught up with."""

    paused_s: float

    def pause(self) -> None:
        """Hold the batches."""


class ForgotPause(FakeIO, GrownLearnerLink):
    """Declares the grown Protocol and so inherits its stub: `pause()` would do nothing."""


class SyncOnce(PlainWorkerLink):
    def once(self, method: str, path: str, body: BaseModel | None, *, timeout_s: float,
             token: str | None = None) -> str:
        return ""


class TextSession(PlainWorkerLink):
    session: str = ""


NoCheck = type("NoCheck", (), {k: v for k, v in vars(PlainWorkerLink).items() if k not in
                               ("check_reachable", "__dict__", "__weakref__")})
NoSession = type("NoSession", (), {k: v for k, v in vars(PlainWorkerLink).items() if k not in
                                   ("session", "__annotations__", "__dict__", "__weakref__")})

BREAKS = [
    (LearnerLink, RenamedKeyword, "RenamedKeyword.fetch_batch: parameters (step, *, wait, step_time_s=None, "
                                  "durable_step=None) where the Protocol has (step, *, wait_s,"),
    (LearnerLink, PositionalWait, "PositionalWait.fetch_batch: parameter 'wait_s' is positional or keyword where "
                                  "the Protocol has it keyword-only"),
    (LearnerLink, DroppedDefault, "DroppedDefault.reject_batch: parameter 'requeue_lease_ids' defaults to nothing "
                                  "where the Protocol's default is ()"),
    (LearnerLink, WrongReturn, "WrongReturn.origin_bytes_sent: return annotated `float` where the Protocol says "
                               "`int`"),
    (LearnerLink, Unannotated, "Unannotated.report_audit: parameter 'verdicts' not annotated (the Protocol says "
                               "`list[GroupAudit]`)"),
    (GrownLearnerLink, FakeIO, "FakeIO.pause: missing method"),
    (GrownLearnerLink, FakeIO, "FakeIO.paused_s: missing attribute"),
    (GrownLearnerLink, ForgotPause, "ForgotPause.pause: not implemented: only the Protocol's stub"),
    (WorkerLink, SyncOnce, "SyncOnce.once: def where the Protocol has async def"),
    (WorkerLink, TextSession, "TextSession.session: attribute annotated `str` where the Protocol says "
                              "`ClientSession|None`"),
    (WorkerLink, NoCheck, "NoCheck.check_reachable: missing method"),
    (WorkerLink, NoSession, "NoSession.session: missing attribute"),
]


def test_a_plain_structural_link_passes():
    assert mismatches(WorkerLink, PlainWorkerLink) == []


@pytest.mark.parametrize(("protocol", "cls", "expected"), BREAKS, ids=[text.split(":")[0] for _, _, text in BREAKS])
def test_the_check_names_each_break(protocol, cls, expected):
    problems = mismatches(protocol, cls)
    assert any(p.startswith(expected) for p in problems), "\n".join(problems) or "no problem reported"


def test_a_fake_of_a_fake_is_found_with_its_file(tmp_path):
    (tmp_path / "fakes.py").write_text("class A(links.LearnerLink): pass\nclass B(A): pass\nclass C: pass\n"
                                       "class D(WorkerLink): pass\n")
    found = declared_implementations(tmp_path, ["LearnerLink", "WorkerLink"])
    assert found == [(tmp_path / "fakes.py", name) for name in ("A", "B", "D")]
