"""A verifiers environment scored by an LLM judge alone (the built-in `reference` judge plugged
into every task's config), for tests/unit/test_verifiers_judges.py."""

from __future__ import annotations

import verifiers.v1 as vf
from verifiers.v1.judges.reference import ReferenceJudgeConfig


class JudgedData(vf.TaskData):
    answer: str


class JudgedTask(vf.Task[JudgedData, vf.State, vf.TaskConfig]):
    pass


class JudgedTaskset(vf.Taskset[JudgedTask, vf.TasksetConfig]):
    def load(self):
        for index in range(6):
            yield JudgedTask(JudgedData(idx=index, prompt="Reply.", answer="RIGHT"),
                             config=vf.TaskConfig(judges=[ReferenceJudgeConfig()]))


__all__ = ["JudgedTaskset"]
