"""Single-turn addition as a verifiers environment: "a+b=" with operands of up to `digits`
digits, drawn from `seed`; reward 1 when the last integer of the reply is the sum. The same
problems as echo2's native `addition` task, so the two paths can be compared on one budget."""

from __future__ import annotations

import random
import re

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


class AdditionTaskset(vf.Taskset[AdditionTask, AdditionTasksetConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        high = 10 ** self.config.digits - 1
        for index in range(self.config.count):
            a, b = rng.randint(0, high), rng.randint(0, high)
            yield AdditionTask(AdditionData(idx=index, prompt=f"{a}+{b}=", answer=str(a + b),
                                            system_prompt=self.config.system_prompt_text or None))


__all__ = ["AdditionTaskset"]
