"""Multi-digit arithmetic with a calculator tool, as a verifiers environment: "Compute a+b."
with operands of `digits` digits, and a calculator (an MCP toolset, verifiers' way) the model may
call with `<tool_call>{"name": "calc_add", "arguments": {"a": 37, "b": 45}}</tool_call>`. The
system prompt says so, since small models' chat templates do not render tool schemas. The
calculator is the taskset's shared toolset: one server for every episode. Reward 1
when the last integer of the final reply is the answer. Its data is generated from `seed`."""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

SYSTEM_PROMPT = ('You have a calculator. To add a and b, reply only '
                 '<tool_call>{"name": "calc_add", "arguments": {"a": A, "b": B}}</tool_call> '
                 "and you will be told the sum. Then reply with the answer.")


class Calculator(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return int(a) + int(b)

    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return int(a) * int(b)


class ArithmeticData(vf.TaskData):
    answer: str


class ArithmeticTask(vf.Task[ArithmeticData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply or "")
        return float(bool(numbers) and numbers[-1] == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class ArithmeticTasksetConfig(vf.TasksetConfig):
    digits: int = 2
    count: int = 1000
    seed: int = 0
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticTasksetConfig]):
    @classmethod
    def toolsets(cls, config: ArithmeticTasksetConfig) -> list[vf.Toolset]:
        """One calculator for every episode (it keeps no state): started once, not per episode."""
        return [Calculator(config.tools)]

    def load(self):
        rng = random.Random(self.config.seed)
        low, high = 10 ** (self.config.digits - 1), 10 ** self.config.digits - 1
        for index in range(self.config.count):
            a, b = rng.randint(low, high), rng.randint(low, high)
            yield ArithmeticTask(ArithmeticData(idx=index, prompt=f"Compute {a}+{b}.", answer=str(a + b),
                                                system_prompt=SYSTEM_PROMPT))


__all__ = ["ArithmeticTaskset"]

if __name__ == "__main__":  # verifiers starts the toolset as `python -m` this module
    Calculator.run()
