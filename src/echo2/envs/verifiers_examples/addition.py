"""Single-turn addition as a verifiers environment: "a+b=" with operands of up to `digits`
digits, drawn from `seed`, or the rows of JSONL files ({"question": ..., "answer": ...}, in
order: benchmarks/env_learning.py gives it the rows echo2's native `math` task trains and
evaluates on); `instruction` goes on the line after each question, as echo2's tasks put it.
Reward 1 when the last integer of the reply is the answer."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import verifiers.v1 as vf


class AdditionData(vf.TaskData):
    answer: str


class AdditionTask(vf.Task[AdditionData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply or "")
        return float(bool(numbers) and numbers[-1] == self.data.answer)


class AdditionTasksetConfig(vf.TasksetConfig):
    digits: int = 1
    count: int = 1000
    seed: int = 0
    system_prompt_text: str = ""
    instruction: str = ""
    data_files: list[str] = []
    """JSONL files of {"question", "answer"} rows: the tasks, in order (then digits, count and
    seed are not used)."""


class AdditionTaskset(vf.Taskset[AdditionTask, AdditionTasksetConfig]):
    def load(self):
        for index, (question, answer) in enumerate(self._rows()):
            prompt = f"{question}\n{self.config.instruction}" if self.config.instruction else question
            yield AdditionTask(AdditionData(idx=index, prompt=prompt, answer=answer,
                                            system_prompt=self.config.system_prompt_text or None))

    def _rows(self):
        if self.config.data_files:
            for name in self.config.data_files:
                for line in Path(name).read_text().splitlines():
                    if line.strip():
                        row = json.loads(line)
                        yield str(row["question"]), str(row["answer"])
            return
        rng = random.Random(self.config.seed)
        high = 10 ** self.config.digits - 1
        for _ in range(self.config.count):
            a, b = rng.randint(0, high), rng.randint(0, high)
            yield f"{a}+{b}=", str(a + b)


__all__ = ["AdditionTaskset"]
