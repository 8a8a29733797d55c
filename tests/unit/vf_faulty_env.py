"""A verifiers environment that misbehaves, for tests/unit/test_verifiers_faults.py: tools that
raise, flood and hang, and a reward function that raises. Its shared toolset is started as
`python -m tests.unit.vf_faulty_env` (the test puts the repository on PYTHONPATH)."""

from __future__ import annotations

import time

import verifiers.v1 as vf


class Faulty(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "bad"

    @vf.tool
    def boom(self) -> str:
        """Raise."""
        raise RuntimeError("kaput")

    @vf.tool
    def flood(self) -> str:
        """Answer far too much."""
        return "x" * 100_000

    @vf.tool
    def hang(self, seconds: float) -> str:
        """Take `seconds`."""
        time.sleep(seconds)
        return "late"


class FaultyData(vf.TaskData):
    answer: str


class FaultyTask(vf.Task[FaultyData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        if self.data.answer == "raise":
            raise ValueError("the reward function broke")
        return float(self.data.answer in (trace.last_reply or ""))


class FaultyTasksetConfig(vf.TasksetConfig):
    answers: list[str] = ["ok", "raise"]
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class FaultyTaskset(vf.Taskset[FaultyTask, FaultyTasksetConfig]):
    @classmethod
    def toolsets(cls, config: FaultyTasksetConfig) -> list[vf.Toolset]:
        return [Faulty(config.tools)]

    def load(self):
        for index, answer in enumerate(self.config.answers):
            yield FaultyTask(FaultyData(idx=index, prompt=f"Say {answer}.", answer=answer))


__all__ = ["FaultyTaskset"]

if __name__ == "__main__":
    Faulty.run()
