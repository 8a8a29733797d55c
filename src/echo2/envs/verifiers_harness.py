"""The agent loop echo2 runs a verifiers environment's tasks with: a chat loop with tools, in the
worker's (or the coordinator's replaying) process. verifiers' own harnesses either need a
container or bootstrap their script's dependencies from the package index on first use (`null`,
through `uv`); a worker may have neither.

Every model call goes through the rollout's interception `endpoint`: that is what records the
turn's token ids and log-probs on the trace (verifiers' harness contract). Tool calls the
renderer parsed run over MCP against the task's toolsets, each bounded in time
(`HarnessConfig.tool_timeout`) and in output (`max_tool_output_chars`); a call that fails,
times out or names an unknown tool answers with one error line, so the episode goes on and the
model sees why. Every answer is recorded for its episode (tool_records.TOOL_ANSWERS); an
episode played back (a worker-trusted one replayed at the coordinator, whose tools cannot run
there) gets its worker's recorded answers instead (TOOL_PLAYBACK).

verifiers finds a harness by importing its id as a module, so the plugin id is the top-level
package `echo2_verifiers`, which exports this class."""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from contextlib import AsyncExitStack

import certifi
import verifiers.v1 as vf
from openai import APIStatusError, AsyncOpenAI, DefaultAsyncHttpxClient
from pydantic import Field
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp

from echo2.envs.tool_records import TOOL_ANSWERS, TOOL_PLAYBACK

HARNESS_ID = "echo2_verifiers"


class Echo2HarnessConfig(vf.HarnessConfig):
    id: str = HARNESS_ID
    tool_timeout: float = Field(10.0, gt=0)
    """Seconds one tool call may take."""
    max_tool_output_chars: int = Field(2000, ge=1)
    """A tool's answer is cut to this many characters (the transcript's budget is the model's)."""


class Echo2Harness(vf.Harness[Echo2HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = False
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):  # noqa: ARG002 (the contract's)
        messages = self._first_messages(data)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0,
                             http_client=DefaultAsyncHttpxClient(verify=_tls_context()))
        servers = {name: {"url": url, "timeout": self.config.tool_timeout} for name, url in mcp_urls.items()}
        try:
            async with AsyncExitStack() as stack:
                tools, dispatch, connections = (await connect_mcp({"mcpServers": servers}, stack)
                                                if servers else ([], {}, {}))
                while True:
                    reply = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                                 **({"tools": tools} if tools else {}))
                    message = reply.choices[0].message
                    messages.append(message.model_dump(exclude_none=True))
                    if not message.tool_calls:
                        break
                    for call in message.tool_calls:
                        answer = await self._answer(trace.id, connections, dispatch, name=call.function.name,
                                                    arguments=call.function.arguments)
                        messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                         "content": answer})
        except APIStatusError as exc:  # the rollout's limits (max_turns, tokens) refuse the next call
            return vf.ProgramResult(exit_code=0 if trace.stop_condition else 1, stdout="", stderr=str(exc))
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    def _first_messages(self, data) -> list[dict]:
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            return [*messages, {"role": "user", "content": prompt}]
        return [*messages, *(m.model_dump(exclude_none=True) for m in prompt or [])]

    async def _answer(self, trace_id: str, connections, dispatch, *, name: str, arguments: str) -> str:
        """The tool's answer, or the recorded one where the episode is played back; recorded."""
        recorded = TOOL_ANSWERS.setdefault(trace_id, [])
        playback = TOOL_PLAYBACK.get(trace_id)
        if playback is None:
            answer = await self._call_tool(connections, dispatch, name, arguments)
        elif len(recorded) < len(playback):
            answer = playback[len(recorded)][:self.config.max_tool_output_chars]
        else:  # the replay called a tool the worker reported no answer for: its tokens will differ
            answer = f"error: no recorded answer for call {len(recorded) + 1} ({name})"
        recorded.append(answer)
        return answer

    async def _call_tool(self, connections, dispatch, name: str, arguments: str) -> str:
        """The tool's answer as text, bounded; one error line when it cannot answer."""
        if name not in dispatch:
            return f"error: no tool named {name!r} (tools: {', '.join(sorted(dispatch)) or 'none'})"
        try:
            parsed = json.loads(arguments or "{}")
            content = await asyncio.wait_for(call_mcp(connections, dispatch, name, parsed),
                                             timeout=self.config.tool_timeout)
        except TimeoutError:
            return f"error: {name} took longer than {self.config.tool_timeout:g} s"
        except Exception as exc:  # a tool's failure is the model's observation, not the episode's end
            return f"error: {name} failed: {type(exc).__name__}: {str(exc)[:200]}"
        text = content if isinstance(content, str) else json.dumps(content)
        return text[:self.config.max_tool_output_chars]


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One context for every episode's client: httpx builds one per client otherwise, loading
    certifi's bundle each time (tens of milliseconds an episode, for a loopback endpoint)."""
    return ssl.create_default_context(cafile=certifi.where())
