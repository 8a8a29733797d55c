"""Episodes of a verifiers environment, played turn by turn by a caller that owns the model.

verifiers runs an episode as an agent program whose model calls go, through its train client,
to a token-level generate endpoint (`POST /inference/v1/generate`: prompt token ids in, sampled
ids and log-probs out). Here that endpoint is served on localhost by this module, and each call
waits until the caller answers it. So the caller sees what echo2's own environments give it
(`echo2.envs.play.play_turns`): every turn, the prompts of the live episodes, answered in one
batch; the worker answers with its engine (its seeded sampler, its versions) and the
coordinator with the tokens a worker submitted (a replay: `replay_episodes`).

An episode comes back in echo2's transcript form (`envs.episode`): the first prompt, then the
model's completions alternating with the environment's segments (what verifiers' renderer put
between one completion and the next prompt: tool results, the next turn's opening), each
completion with its log-probs, and the environment's tokens masked out of the loss. The ids are
the engine's: every prompt after the first must extend the previous prompt and completion
exactly (`verifiers_renderer.ExactRenderer` makes verifiers' client do so), else the episode is
refused with `NotExact`. The reward is verifiers' own, computed by the task's reward functions
in the process that plays the episode (the coordinator recomputes it by replay).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from aiohttp import web

from echo2.envs.episode import ReplayMismatch
from echo2.envs.tool_records import TOOL_ANSWERS, TOOL_PLAYBACK

Action = tuple[list[int], list[float]]
"""Sampled token ids (the end-of-sequence token included when it ended the turn) and their log-probs."""


class NotExact(ValueError):
    """A prompt that does not extend the previous prompt and completion of its episode."""


@dataclass(frozen=True)
class GenerationCall:
    episode: int
    """Index of the episode among those played together."""
    prompt_ids: list[int]
    """The whole context the model continues."""
    max_tokens: int


@dataclass
class PlayedEpisode:
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    """After the first prompt: completions and environment segments, alternating, a completion first."""
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-prob of each token of `token_ids`; 0.0 on the environment's (never trained)."""
    segments: list[int] = field(default_factory=list)
    reward: float = 0.0
    ended: str = ""
    """verifiers' stop condition ("agent_completed", "max_turns", a timeout or an error)."""
    errors: list[str] = field(default_factory=list)
    out_of_tokens: bool = False
    """It ended because `max_episode_tokens` left no room for another completion."""
    tool_answers: list[str] = field(default_factory=list)
    """What its tool calls answered, in order (TOOL_ANSWERS)."""

    def check_extends(self, prompt_ids: list[int]) -> None:
        """NotExact unless `prompt_ids` begins with everything so far, token for token."""
        so_far = self.prompt_ids + self.token_ids
        if self.segments and prompt_ids[:len(so_far)] != so_far:
            raise NotExact(f"turn {len(self.segments) // 2 + 1}'s prompt does not extend the previous prompt and "
                           "completion (the renderer re-rendered the conversation): use "
                           "echo2.envs.verifiers_renderer.ExactRenderer")

    def add_turn(self, prompt_ids: list[int], action: Action) -> None:
        self.check_extends(prompt_ids)
        if not self.segments:
            self.prompt_ids = list(prompt_ids)
        else:
            between = prompt_ids[len(self.prompt_ids) + len(self.token_ids):]
            self.token_ids += between
            self.logprobs += [0.0] * len(between)
            self.segments.append(len(between))
        ids, logprobs = action
        self.token_ids += ids
        self.logprobs += logprobs
        self.segments.append(len(ids))

    @property
    def model_mask(self) -> list[bool]:
        """Per token of `token_ids`: the model's (trained) or the environment's (context)."""
        return [index % 2 == 0 for index, length in enumerate(self.segments) for _ in range(length)]


Answer = Callable[[list[GenerationCall]], list[Action]]
"""The pending calls of every live episode (one each) -> the answer to each, in order."""


class LockPerLoop:
    """An asyncio lock for each event loop that uses it. `renderers.client` guards its model-card
    lookup with one module-wide asyncio.Lock; once a loop has waited on it, waiting on it from
    another loop raises, so the second turn server of a process (the learner's next evaluation, a
    scorer beside a player) failed every first model call but one of its episodes."""

    def __init__(self) -> None:
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()

    def _lock(self) -> asyncio.Lock:
        return self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())

    async def __aenter__(self) -> None:
        await self._lock().acquire()

    async def __aexit__(self, *exc) -> None:
        self._lock().release()


def _lock_renderers_per_loop() -> None:
    import renderers.client

    if not isinstance(renderers.client._max_prompt_len_lock, LockPerLoop):
        renderers.client._max_prompt_len_lock = LockPerLoop()


class TurnServer:
    """The generate endpoint on 127.0.0.1, in a private event loop on its own thread: each call
    waits in `pending` until `answer` gives its tokens."""

    def __init__(self, stop_ids: Sequence[int]) -> None:
        _lock_renderers_per_loop()
        self.stop_ids = set(stop_ids)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="verifiers-turns", daemon=True)
        self.changed = threading.Condition()
        self.waiting: dict[str, tuple[GenerationCall, asyncio.Future]] = {}
        self.sessions: dict[str, int] = {}  # verifiers' trace id (its X-Session-ID) -> episode index
        self.runner: web.AppRunner | None = None
        self.port = 0

    def __enter__(self) -> TurnServer:
        self.thread.start()
        self.port = self.run(self._start())
        return self

    def __exit__(self, *exc) -> None:
        if self.runner is not None:
            self.run(self.runner.cleanup())
        self.run(_cancel_the_rest())
        # the loop's executor threads (verifiers' to_thread calls) and its selector go with it:
        # a process makes a turn server per evaluation, and each one left 4 threads and 3 files
        self.run(self.loop.shutdown_default_executor())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()

    def run(self, coroutine, timeout_s: float | None = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _start(self) -> int:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/inference/v1/generate", self._generate)
        app.router.add_get("/v1/models", self._models)
        # a stop waits this long for open keep-alive connections (the agent's client), then cuts them
        self.runner = web.AppRunner(app, shutdown_timeout=1.0, handle_signals=False, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def _models(self, request: web.Request) -> web.Response:  # noqa: ARG002
        return web.json_response({"object": "list", "data": []})  # no length check: the caller's budget is

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        session = request.headers.get("X-Session-ID", "")
        if session not in self.sessions:
            return web.json_response({"error": f"unknown session {session!r}"}, status=400)
        call = GenerationCall(self.sessions[session], [int(t) for t in body["token_ids"]],
                              int(body.get("sampling_params", {}).get("max_tokens") or 1))
        future = self.loop.create_future()
        with self.changed:
            self.waiting[session] = (call, future)
            self.changed.notify_all()
        answered = await future
        if answered == REFUSED:
            return web.json_response({"error": "episode refused (its prompt does not extend its transcript)"},
                                     status=400)
        ids, logprobs = answered
        finish = "stop" if ids and ids[-1] in self.stop_ids else "length"
        content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids, logprobs, strict=True)]
        return web.json_response({"choices": [{"token_ids": ids, "finish_reason": finish,
                                               "logprobs": {"content": content}}]})


async def _cancel_the_rest() -> None:
    """Whatever still runs on the loop (an abandoned episode's handlers) ends with it."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


REFUSED = "refused"
"""What a call gets when its episode was refused (its prompt not exact): the harness sees an error and stops."""


def play_episodes(server: TurnServer, agent, tasks: Sequence, answer: Answer, *, timeout_s: float = 600.0,
                  max_episode_tokens: int | None = None, tools: dict | None = None,
                  tool_playback: Sequence[list[str]] | None = None) -> list[PlayedEpisode]:
    """Run one episode per task with `agent` (a verifiers Agent whose client points at
    `server`), answering every turn's calls with `answer`; a completion is cut to what is left
    of `max_episode_tokens` after the first prompt, and an episode with none left ends. An
    exception from `answer` (a replay's mismatch) ends every episode and is raised here. `tools`:
    the taskset's shared tool servers, already running. `tool_playback`: per task, the answers
    its tool calls get instead of running the tools (TOOL_PLAYBACK)."""
    played = [PlayedEpisode() for _ in tasks]
    traced: list[str] = []  # the episodes' trace ids, whose tool records are dropped however they end
    runs = [server.run(_start(server, agent, task, k, tools=tools or None, traced=traced,
                              playback=None if tool_playback is None else list(tool_playback[k])))
            for k, task in enumerate(tasks)]
    for run in runs:
        run.add_done_callback(lambda _: _notify(server))
    try:
        while calls := _next_turn(server, runs, timeout_s):
            _answer_turn(server, played, calls, answer, max_episode_tokens=max_episode_tokens)
        traces = [server.run(_result(run), timeout_s) for run in runs]
    except BaseException:
        _abandon(server, runs)
        raise
    finally:
        recorded = {trace_id: TOOL_ANSWERS.pop(trace_id, []) for trace_id in traced}
        for trace_id in traced:  # the server lives as long as its process: its sessions must not
            TOOL_PLAYBACK.pop(trace_id, None)
            server.sessions.pop(trace_id, None)
    for episode, trace in zip(played, traces, strict=True):
        episode.reward = float(trace.reward or 0.0)
        episode.ended = "tokens" if episode.out_of_tokens else str(trace.stop_condition or "")
        episode.errors += [str(error.message)[:500] for error in trace.errors]
        if trace.is_timeout:  # verifiers scores it 0 and records no error: a failure all the same
            episode.errors.append(f"{trace.stop_condition}: a deadline of the episode (task.episode_timeout_s, "
                                  "waiting for the model included) expired")
        episode.tool_answers = recorded.get(trace.id, [])
    return played


async def _start(server: TurnServer, agent, task, index: int, *, tools: dict | None, traced: list[str],
                 playback: list[str] | None) -> asyncio.Task:
    def minted(trace) -> None:  # before its first model call: its session is this episode
        server.sessions[trace.id] = index
        traced.append(trace.id)
        if playback is not None:
            TOOL_PLAYBACK[trace.id] = playback
    return asyncio.ensure_future(agent.run(task, on_trace=minted, tools=tools))


async def _result(run: asyncio.Task):
    return await run


def _notify(server: TurnServer) -> None:
    with server.changed:
        server.changed.notify_all()


def _next_turn(server: TurnServer, runs: list, timeout_s: float) -> list[tuple[GenerationCall, asyncio.Future]]:
    """Wait until every live episode waits for its next completion; those calls, by episode
    (empty once every episode has ended)."""
    with server.changed:
        if not server.changed.wait_for(lambda: len(server.waiting) >= sum(not r.done() for r in runs), timeout_s):
            raise TimeoutError(f"a verifiers episode made no model call and did not end within {timeout_s:g} s")
        calls = sorted(server.waiting.values(), key=lambda pending: pending[0].episode)
        server.waiting.clear()
    return calls


def _answer_turn(server: TurnServer, played: list[PlayedEpisode], calls, answer: Answer, *,
                 max_episode_tokens: int | None) -> None:
    exact = []
    for call, future in calls:
        episode = played[call.episode]
        try:
            if episode.errors:
                raise NotExact(episode.errors[-1])
            episode.check_extends(call.prompt_ids)
        except NotExact as exc:
            episode.errors.append(str(exc))
            server.loop.call_soon_threadsafe(_settle, future, REFUSED)
            continue
        used = len(call.prompt_ids) - len(episode.prompt_ids) if episode.segments else 0
        left = call.max_tokens if max_episode_tokens is None else min(call.max_tokens, max_episode_tokens - used)
        if left < 1:  # the budget is spent: the episode ends with its last completion
            episode.out_of_tokens = True
            server.loop.call_soon_threadsafe(_settle, future, REFUSED)
            continue
        exact.append((replace(call, max_tokens=left), future))
    if not exact:
        return
    actions = answer([call for call, _ in exact])
    for (call, future), action in zip(exact, actions, strict=True):
        played[call.episode].add_turn(call.prompt_ids, action)
        server.loop.call_soon_threadsafe(_settle, future, action)


def _settle(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _abandon(server: TurnServer, runs: list) -> None:
    with server.changed:
        pending = list(server.waiting.values())
        server.waiting.clear()
    for _, future in pending:
        server.loop.call_soon_threadsafe(_settle, future, REFUSED)
    for run in runs:
        server.loop.call_soon_threadsafe(run.cancel)


def playback(expected: Sequence[PlayedEpisode]) -> Answer:
    """The answers a replay gives: episode k's turns are the model's segments of `expected[k]`,
    and each call's prompt must be exactly the submitted transcript up to that turn."""

    def answer(calls: list[GenerationCall]) -> list[Action]:
        actions = []
        for call in calls:
            want = expected[call.episode]
            turn = sum(1 for _ in _model_segments(want, before=len(call.prompt_ids) - len(want.prompt_ids)))
            offsets = list(_model_segments(want))
            if turn >= len(offsets):
                raise ReplayMismatch(f"episode {call.episode}: the environment asked for turn {turn + 1}, but the "
                                     f"transcript ends after {len(offsets)}")
            start, length = offsets[turn]
            if length > call.max_tokens:
                raise ReplayMismatch(f"episode {call.episode}, turn {turn + 1}: {length} tokens, more than the "
                                     f"{call.max_tokens} the turn allows")
            if call.prompt_ids != want.prompt_ids + want.token_ids[:start]:
                raise ReplayMismatch(f"episode {call.episode}, turn {turn + 1}: the environment's tokens before it "
                                     "differ from the transcript's (a tool result or turn the environment did "
                                     "not give)")
            actions.append((want.token_ids[start:start + length], [0.0] * length))
        return actions

    return answer


def _model_segments(episode: PlayedEpisode, before: int | None = None):
    """(start, length) of each model segment in `token_ids`; given `before`, those that start
    before that position (the turns a context of that length has already had)."""
    start = 0
    for index, length in enumerate(episode.segments):
        if index % 2 == 0 and (before is None or start < before):
            yield start, length
        start += length


def check_replayed(expected: Sequence[PlayedEpisode], replayed: Sequence[PlayedEpisode]) -> None:
    """The replay reproduced every submitted episode token for token, to its end."""
    for k, (want, got) in enumerate(zip(expected, replayed, strict=True)):
        if got.errors and not got.segments:
            raise ReplayMismatch(f"episode {k} did not replay: {got.errors[-1]}")
        if (got.prompt_ids, got.token_ids, got.segments) != (want.prompt_ids, want.token_ids, want.segments):
            raise ReplayMismatch(f"episode {k}: the replay ended after {len(got.token_ids)} tokens in "
                                 f"{len(got.segments)} segments; the transcript has {len(want.token_ids)} in "
                                 f"{len(want.segments)} (cut short, or run past its end)")
