"""What the tool calls of running verifiers episodes answered, shared between echo2's harness
(envs.verifiers_harness, which calls the tools) and the turn loop (envs.verifiers_play, which
builds the episodes), keyed by verifiers' trace id of each episode."""

from __future__ import annotations

TOOL_ANSWERS: dict[str, list[str]] = {}
"""Per running episode: what each of its tool calls answered, in order, as the harness recorded
it; `play_episodes` moves it onto the episode. A worker-trusted episode carries it to the
coordinator (RolloutCompletion.tool_answers)."""
TOOL_PLAYBACK: dict[str, list[str]] = {}
"""Per running episode: the answers the harness gives its tool calls instead of running the
tools (a worker-trusted episode replayed at the coordinator, whose tools cannot run there)."""
