"""Where a catalog worker class runs when SkyPilot rents it: the `[workers.NAME.skypilot]` table.

    [workers.a10g_spot.skypilot]
    accelerators = ["A10G:1", "L4:1"]     # alternatives: SkyPilot takes the cheapest it can get
    use_spot = true
    infra = "aws/us-east-1"               # cloud[/region[/zone]], "k8s/CONTEXT", or omit: any enabled

    [workers.l4_anywhere.skypilot]
    use_spot = true
    any_of = [{ accelerators = "A10G:1", infra = "aws" }, { accelerators = "L4:1", infra = "gcp" }]

The fields map one to one onto SkyPilot's task `resources` (echo2.launch.skypilot builds the task
and SkyPilot's own parser checks it again). This module does not import SkyPilot: a catalog with
these tables loads, and `echo2 plan` reads it, where SkyPilot is not installed.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from echo2.config.base import Frozen

# "A10G:1", "H100:8", "L4", "tpu-v5e-8", "A100-80GB:0.5" (a fraction: GPU sharing on Kubernetes)
ACCELERATOR_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*(:[0-9]+(\.[0-9]+)?)?$")
# cloud[/region[/zone]] or "*" for any cloud; k8s/kubernetes take a context, which may hold '/' and ':'
INFRA_PATTERN = re.compile(r"^(?:(?:\*|[a-z][a-z0-9]*)(?:/[^/\s]+){0,2}|(?:k8s|kubernetes)(?:/\S+)?)$", re.IGNORECASE)


def check_accelerator(value: str) -> str:
    if not ACCELERATOR_PATTERN.match(value):
        raise ValueError(f"{value!r} is not an accelerator: write NAME:COUNT, e.g. 'A10G:1' or 'H100:8' "
                         "(`sky show-gpus` lists the names)")
    return value


def check_infra(value: str | None) -> str | None:
    if value is not None and not INFRA_PATTERN.match(value):
        raise ValueError(f"{value!r} is not an infra: write cloud[/region[/zone]] ('aws', 'gcp/us-central1'), "
                         "'k8s/CONTEXT' for a Kubernetes context, or leave it out for any enabled cloud")
    return value


class SkyAlternative(Frozen):
    """One `any_of` alternative: an accelerator, optionally pinned to an infra."""

    accelerators: str
    """NAME:COUNT of one machine, e.g. "L4:1"."""
    infra: str | None = None
    """Where this alternative may run (cloud[/region[/zone]] or k8s/CONTEXT); None: anywhere the
    class's `infra` allows, or any enabled cloud."""

    _accelerators = field_validator("accelerators")(check_accelerator)
    _infra = field_validator("infra")(check_infra)


class SkyPilotClass(Frozen):
    """The machine SkyPilot rents for one worker of this class (one node)."""

    accelerators: list[str] = Field(default_factory=list, max_length=32)
    """Alternatives (NAME:COUNT), any of which serves: SkyPilot's optimizer picks the cheapest it
    can get where `infra` allows (or the first it can get, with `in_order`). Give this or `any_of`."""
    in_order: bool = False
    """True: `accelerators` is an order of preference (SkyPilot tries the first, then the next);
    False: SkyPilot takes whichever is cheapest."""
    any_of: list[SkyAlternative] = Field(default_factory=list, max_length=32)
    """Alternatives each pinned to its own infra ({accelerators, infra}): e.g. an A10G on AWS or
    an L4 on GCP, so a class whose region ran out of spot capacity comes back elsewhere."""
    use_spot: bool = False
    """Spot (preemptible) machines: cheaper, and taken back at the cloud's will; the fleet then
    starts a replacement of the same class (echo2.launch.skypilot)."""
    infra: str | None = None
    """cloud[/region[/zone]] ("aws/us-east-1", "gcp"), or "k8s/CONTEXT" for a Kubernetes context
    of your kubeconfig; None: any cloud `sky check` enabled."""
    disk_size_gb: int | None = Field(None, ge=10, le=65536)
    """Boot disk in GB; None: SkyPilot's default (256). The model, the wheel cache and torch need
    some 30 GB for an 8B model in bf16."""
    image_id: str | None = Field(None, min_length=1)
    """A machine or container image ("docker:IMAGE" works on every cloud and on Kubernetes); None:
    SkyPilot's default image."""

    @field_validator("accelerators")
    @classmethod
    def _each_accelerator(cls, value: list[str]) -> list[str]:
        names = [_name_and_count(check_accelerator(item))[0] for item in value]
        if len(set(names)) != len(names):
            raise ValueError(f"{value}: each accelerator once (the alternatives are told apart by name)")
        return value

    _infra = field_validator("infra")(check_infra)

    @model_validator(mode="after")
    def _one_way_to_choose(self) -> SkyPilotClass:
        if bool(self.accelerators) == bool(self.any_of):
            raise ValueError("give exactly one of accelerators (e.g. ['A10G:1', 'L4:1']) or any_of "
                             "(e.g. [{accelerators = 'L4:1', infra = 'gcp'}]): an echo2 worker needs an accelerator")
        pinned = [alt.infra for alt in self.any_of if alt.infra is not None]
        if self.infra is not None and pinned:
            raise ValueError(f"infra = {self.infra!r} and any_of alternatives pinned to {pinned}: give the infra "
                             "either for the whole class or per alternative, not both")
        return self

    def resources(self) -> dict:
        """The task's `resources` section in SkyPilot's YAML schema."""
        out: dict = {"use_spot": self.use_spot}
        if self.infra is not None:
            out["infra"] = self.infra
        if self.disk_size_gb is not None:
            out["disk_size"] = self.disk_size_gb
        if self.image_id is not None:
            out["image_id"] = self.image_id
        if self.accelerators and self.in_order:
            out["accelerators"] = list(self.accelerators)  # a YAML list: SkyPilot's order of preference
        elif self.accelerators:
            out["accelerators"] = dict(_name_and_count(item) for item in self.accelerators)  # a set: any
        else:
            out["any_of"] = [{k: v for k, v in alt.model_dump().items() if v is not None} for alt in self.any_of]
        return out


def _name_and_count(accelerator: str) -> tuple[str, float | None]:
    """"A10G:1" -> ("A10G", 1); "tpu-v5e-8" -> ("tpu-v5e-8", None): SkyPilot's mapping form."""
    name, _, count = accelerator.partition(":")
    if not count:
        return name, None
    return name, int(count) if count.isdigit() else float(count)
