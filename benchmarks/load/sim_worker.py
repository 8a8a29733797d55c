"""One simulated rollout worker, speaking the coordinator's worker protocol exactly as
`echo2.rollout.worker.Worker` does, with generation and weight fetches replaced by sleeps. This
is the ONLY module of the load benchmark that knows the worker wire protocol (protocol 8):
when the protocol changes, this class is what changes; the client, the harness and the report
stay.

What it does, step for step as the real worker (file: function there):
- GET /v1/broadcast_config, then POST /v1/register with the join token, retried on 409/429
  for up to 60 s and through a busy coordinator's 503 as its Retry-After says (worker.py:
  `_broadcast_config`, `_join`; link.py: `retrying`); every later call carries the credential;
- its news line (control.py: `_listen`): GET /v1/news held open, each line a reply naming the
  newest version, what to fetch and from where, and whether to work; opened again after a
  failure, with backoff;
- heartbeats (control.py: `_beat`): answered at once, at the interval each reply names; one at
  once when a fetch left it behind the newest (`beat_now`); 401/404 (evicted) registers again;
- the version follower (follower.py): after news, "fetches" the version named by `fetch` (and
  only with an `assignment`) for a simulated `fetch_s`, then stages it; the work loop swaps it
  in between generations;
- the work loop (`_work`): no lease while too stale (policy.too_stale); a lease long-polled
  (wait_s 5 s, 0 when a newer version is on its way), retried with backoff on transient
  failures; a refusal waits its retry_after_s (an idle worker's is long, and activation on its
  news line cuts it short); a grant "generates" for `gen_s` and submits each
  task's group in turn (well-formed: digits of the tokenizer, some the right answer, one
  log-prob per token);
- POST /v1/leave when stopped.

Requests are timed (`Recorder`): latency of every answered request, an outcome for every
request (ok, http_<status>, timeout, connect_error, disconnected, cut_short)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import aiohttp
from pydantic import BaseModel

from echo2.policy import too_stale
from echo2.protocol import messages as m
from echo2.rollout.waits import unless_set, wait_either
from load.answers import AnswerBook
from load.news_reader import NewsLine, NewsRefused, open_line
from load.stats import Recorder

SPEAKS_PROTOCOL = 11
NEWS_SILENCE_S = 65.0  # control.py: a news line silent this long is opened again
NEWS_RETRY_S = (0.5, 30.0)  # control.py: pause before opening a failed line again, doubling
HEARTBEAT_TIMEOUT_S = 5.0  # worker.py: a heartbeat slower than this is as good as lost
JOIN_WAIT_S = 60.0  # worker.py: how long a registration refused with 409/429 is tried again
LEASE_WAIT_S = 5.0  # worker.py: the longest a lease request may be held while the window is full
FIRST_RETRY_S, LONGEST_RETRY_S = 0.2, 5.0  # link.py: backoff of a call that failed in transit
PRICES = (0.34, 0.34, 0.79, 2.69)  # the demo's four emulated worker prices, in turn


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class Transient(Exception):
    """Timeout, connection failure or 5xx: the real worker retries these (after `retry_after_s`
    when the coordinator said when)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class SimSettings:
    url: str
    join_token: str
    gen_s: tuple[float, float] = (0.3, 1.0)
    """Simulated generation time of one lease (uniform in this range)."""
    fetch_s: tuple[float, float] = (0.1, 0.3)
    """Simulated time from version news to the version staged (its fetch)."""
    tasks_per_lease: int = 2
    correct_fraction: float = 0.5
    """Share of completions that are the right answer (the rest random digits): groups carry
    reward variance, so grpo.drop_uninformative_groups drops few of them."""
    request_timeout_s: float = 30.0  # WorkerConfig.request_timeout_s's default
    relay: bool = True
    """Advertise a relay address (never served: nobody fetches from a simulated worker), so the
    coordinator plans relay trees over the fleet as for real relaying workers."""


def completion(answers: AnswerBook, prompt_ids: list[int], max_new_tokens: int, *, correct_fraction: float,
               rng: random.Random) -> m.RolloutCompletion:
    """One well-formed completion: the right answer `correct_fraction` of the time, else random
    digits; one log-prob per token, in (-3, 0)."""
    ids = answers.answer(prompt_ids)[:max_new_tokens]
    if not ids or rng.random() >= correct_fraction:
        ids = [rng.choice(answers.digits) for _ in range(rng.randint(1, max_new_tokens))]
    return m.RolloutCompletion(token_ids=ids, logprobs=[-rng.uniform(0.01, 3.0) for _ in ids])


class SimWorker:
    def __init__(self, index: int, name: str, source_ip: str, settings: SimSettings, *, recorder: Recorder,
                 answers: AnswerBook) -> None:
        self.index, self.worker_id, self.source_ip = index, name, source_ip
        self.settings, self.recorder, self.answers = settings, recorder, answers
        self.rng = random.Random(index)
        self.session: aiohttp.ClientSession | None = None
        self.credential = ""
        self.registered_at = 0.0
        self.heartbeat_interval_s, self.max_staleness = 1.0, 0
        self.version, self.staged, self.latest = -1, -1, -1
        self.target: tuple[int, float] | None = None  # what to pull next (the reply's `fetch`): version, published at
        self.assigned = False  # the reply named a source for `target`
        self.published_at: dict[int, float] = {}
        self.active = True
        self.stats = {"rollouts": 0, "busy_s": 0.0}
        self.generation_s: float | None = None
        self.dissemination_s: float | None = None
        self.swap_s: float | None = None
        self.beat_now, self.ready = asyncio.Event(), asyncio.Event()
        self.fetching = -1  # the version a fetch (a timer) is running for
        self.woken = asyncio.Event()  # activated: an idle worker asks for work at once
        self.stop: asyncio.Event | None = None

    # ---- lifecycle ----
    async def run(self, stop: asyncio.Event) -> None:
        """Join, work until `stop`, leave. Never raises for the coordinator's doing: failures
        are recorded (the harness counts them)."""
        self.stop = stop
        connector = aiohttp.TCPConnector(local_addr=(self.source_ip, 0), limit=0)
        async with aiohttp.ClientSession(connector=connector) as self.session:
            _, joined = await unless_set(stop, self._join())
            if not joined:
                return
            loops = [asyncio.create_task(c) for c in (self._heartbeats(), self._listen(), self._work())]
            await stop.wait()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._leave()

    async def _join(self) -> bool:
        """The broadcast config (fetched before registering, as a worker starts its relay with
        it), then the registration; False when the coordinator refused or never answered."""
        try:
            await self._retrying("broadcast_config", "/v1/broadcast_config", None, token=self.settings.join_token,
                                 method="GET")
            await self._register()
        except (Refused, Transient):
            self.recorder.count("join_failed")
            return False
        return True

    async def _register(self) -> None:
        s = self.settings
        relay = f"http://{self.source_ip}:{20000 + self.index % 40000}" if s.relay else ""
        req = m.RegisterRequest(worker_id=self.worker_id, engine="sim", price_per_hour=PRICES[self.index % 4],
                                relay_address=relay, release=m.RELEASE, sampler="seeded")
        deadline = time.monotonic() + JOIN_WAIT_S
        while True:
            try:
                text = await self._retrying("register", "/v1/register", req, token=s.join_token)
                break
            except Refused as exc:
                if exc.status not in (409, 429) or time.monotonic() > deadline:
                    raise
                await wait_either(self.stop, self.stop, timeout_s=1.0)
        reg = m.RegisterResponse.model_validate_json(text)
        self.credential, self.worker_id = reg.credential, reg.worker_id
        self.heartbeat_interval_s, self.max_staleness = reg.heartbeat_interval_s, reg.max_staleness
        self.registered_at = time.monotonic()
        self.recorder.count("registered")
        self.beat_now.set()  # the first heartbeat brings the newest version

    async def _reregister(self, seen_at: float) -> None:
        """Join again after an eviction, once however many loops noticed it."""
        if self.registered_at != seen_at:
            return
        self.registered_at = -1.0  # the other loops that noticed do not join too
        self.recorder.count("reregistered")
        try:
            await self._register()
        except (Refused, Transient):
            self.recorder.count("reregister_failed")
            self.registered_at = seen_at

    async def _leave(self) -> None:
        try:
            await self._call("leave", "POST", "/v1/leave", m.LeaveRequest(worker_id=self.worker_id),
                             timeout_s=HEARTBEAT_TIMEOUT_S)
        except (Refused, Transient):
            pass

    # ---- heartbeats and versions ----
    async def _heartbeats(self) -> None:
        while not self.stop.is_set():
            self.beat_now.clear()
            seen_at, started = self.registered_at, time.monotonic()
            try:
                await self._beat_once()
            except (ValueError, KeyError, TypeError):
                self.recorder.count("bad_reply")
            except Refused as exc:
                if exc.status in (401, 404):  # evicted, or a coordinator that forgot us: join again
                    await self._reregister(seen_at)
            except Transient:
                pass
            pause_s = self.heartbeat_interval_s - (time.monotonic() - started)
            await wait_either(self.beat_now, self.stop, timeout_s=pause_s, consume=False)

    async def _beat_once(self) -> None:
        body = m.Heartbeat(worker_id=self.worker_id, version=self.version, base_version=self.holding(),
                           swap_s=self.swap_s, dissemination_s=self.dissemination_s, generation_s=self.generation_s,
                           rollouts_total=self.stats["rollouts"], busy_s_total=self.stats["busy_s"])
        text = await self._call("heartbeat", "POST", "/v1/heartbeat", body, timeout_s=HEARTBEAT_TIMEOUT_S)
        self._heard(_reply(text))

    async def _listen(self) -> None:
        """The news line, opened again after a failure (control.py: `_listen`)."""
        pause_s = NEWS_RETRY_S[0]
        while not self.stop.is_set():
            seen_at = self.registered_at
            try:
                await self._read_news()
                pause_s = NEWS_RETRY_S[0]
                continue
            except Refused as exc:
                if exc.status in (401, 404):
                    await self._reregister(seen_at)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self.recorder.outcome("news_line", "disconnected", time.time(), reason=type(exc).__name__)
            except (ValueError, KeyError, TypeError):
                self.recorder.count("bad_reply")
            finally:
                LINES.pop(self, None)
            await wait_either(self.stop, self.stop, timeout_s=pause_s)
            pause_s = min(2 * pause_s, NEWS_RETRY_S[1])

    async def _read_news(self) -> None:
        """One line, open until it ends (`news_reader`: the real worker's request, read without
        a task woken per line)."""
        started_at, started = time.time(), time.perf_counter()
        try:
            line = await open_line(self.settings.url, self.credential, self.source_ip, self._news_line,
                                   connect_timeout_s=10.0)
        except NewsRefused as exc:
            message = _error_text(exc.body)
            self.recorder.outcome("news_line", f"http_{exc.status}", started_at, reason=message)
            raise Refused(exc.status, message) from None
        self.recorder.took("news_line", started_at, (time.perf_counter() - started) * 1000.0)
        self.recorder.outcome("news_line", "ok", started_at)
        LINES[self] = line
        try:
            await line.ended
        finally:
            line.close()

    def _news_line(self, raw: bytes) -> None:
        try:
            self._heard(_reply(raw), news=True)
        except (ValueError, KeyError, TypeError):
            self.recorder.count("bad_reply")

    def _heard(self, reply: dict, *, news: bool = False) -> None:
        """A reply or a news line (control.py: `heard`); a newer version told on the line is
        timed from its publish (the news latency)."""
        latest = reply["latest"]
        if news and latest is not None and latest["version"] > self.latest:
            self.recorder.took("version_news", latest["published_at"],
                               max(0.0, time.time() - latest["published_at"]) * 1000.0)
        self._note(reply)
        if reply["active"] and not self.active:
            self.woken.set()
        self.active = reply["active"]
        self.heartbeat_interval_s = reply["heartbeat_interval_s"]

    def _note(self, reply: dict) -> None:
        """follower.py's `note`: the newest version, what to pull next and whether from anywhere."""
        info = reply["latest"]
        if info is None or info["version"] < self.latest:
            return
        fetch = reply["fetch"] or info
        target = (fetch["version"], fetch["published_at"])
        assigned = reply["assignment"] is not None and reply["assignment"]["version"] == target[0]
        if info["version"] != self.latest or target != self.target or assigned != self.assigned:
            self.latest, self.target, self.assigned = info["version"], target, assigned
            self.published_at[info["version"]] = info["published_at"]
            self._follow()

    def holding(self) -> int:
        return max(self.version, self.staged)

    def _follow(self) -> None:
        """Fetch (a timer) what the coordinator said to pull, then stage it; ask for news at once
        when the fetch was a step on the way to the newest. A timer callback, not a task per
        worker: thousands of simulated workers fetch every version in one client process."""
        target = self.target
        if target is None or not self.assigned or target[0] <= max(self.holding(), self.fetching):
            return
        self.fetching = target[0]
        asyncio.get_running_loop().call_later(self.rng.uniform(*self.settings.fetch_s), self._staged, target)

    def _staged(self, target: tuple[int, float]) -> None:
        self.fetching = -1
        if self.stop.is_set() or target[0] <= self.staged:
            return
        self.staged = target[0]
        self.dissemination_s = max(0.0, time.time() - target[1])
        self.ready.set()
        if target[0] < self.latest:  # a step on the way: its heartbeat's reply names the next
            self.beat_now.set()
        self._follow()  # news that came while this fetch ran

    def _swap_in(self) -> None:
        if self.staged > self.version:
            self.version, self.swap_s = self.staged, 0.0

    # ---- work ----
    async def _work(self) -> None:
        while not self.stop.is_set():
            self._swap_in()
            if self.version < 0 or too_stale(self.latest if self.latest >= 0 else None, self.version,
                                             self.max_staleness):
                await wait_either(self.ready, self.stop, timeout_s=1.0)
                continue
            started = time.perf_counter()
            lease = await self._lease()
            if lease is None or not lease.tasks:
                retry_s = lease.retry_after_s if lease is not None else 1.0
                if lease is not None and self.latest > self.version:  # refused at this version: load the next
                    await wait_either(self.ready, self.stop, timeout_s=max(retry_s, 1.0))
                else:  # an idle worker is told to come back late: activation cuts its wait short
                    self.woken.clear()
                    await wait_either(self.woken, self.stop, timeout_s=retry_s)
                continue
            await self._generate_and_submit(lease.tasks)
            self.generation_s = time.perf_counter() - started
            self.stats["busy_s"] += self.generation_s

    async def _lease(self) -> m.LeaseResponse | None:
        behind = self.latest > self.version
        wait_s = 0.0 if behind else min(LEASE_WAIT_S, self.settings.request_timeout_s / 3)
        body = m.LeaseRequest(worker_id=self.worker_id, version=self.version,
                              max_tasks=self.settings.tasks_per_lease, wait_s=wait_s)
        seen_at = self.registered_at
        try:
            answered, text = await unless_set(self.stop, self._retrying("lease", "/v1/lease", body))
        except Refused as exc:
            if exc.status == 404:
                await self._reregister(seen_at)
            return None
        if not answered:
            return None
        reply = m.LeaseResponse.model_validate_json(text)
        if reply.evaluation is not None:  # the benchmark's runs evaluate on the learner: never expected
            self.recorder.count("evaluation_lease_unexpected")
        self.recorder.count("lease_granted" if reply.tasks else "lease_refused")
        return reply

    async def _generate_and_submit(self, tasks: list[m.Task]) -> None:
        version, started = self.version, time.perf_counter()
        await asyncio.sleep(self.rng.uniform(*self.settings.gen_s))
        per_task_s = (time.perf_counter() - started) / len(tasks)
        for task in tasks:
            s = task.sampling
            completions = [completion(self.answers, task.prompt_ids, s.max_new_tokens,
                                      correct_fraction=self.settings.correct_fraction, rng=self.rng)
                           for _ in range(s.group_size)]
            body = m.RolloutSubmission(worker_id=self.worker_id, lease_id=task.lease_id, version=version,
                                       completions=completions, gen_time_s=per_task_s)
            try:
                reply = m.SubmitResponse.model_validate_json(await self._retrying("rollout", "/v1/rollout", body))
                self.recorder.count("rollout_accepted" if reply.accepted else "rollout_dropped")
                if reply.reason.startswith("uninformative"):
                    self.recorder.count("rollout_uninformative")
            except Refused:
                self.recorder.count("rollout_refused")
            self.stats["rollouts"] += len(completions)

    # ---- HTTP ----
    async def _retrying(self, kind: str, path: str, body: BaseModel | None, *, token: str | None = None,
                        method: str = "POST") -> str:
        """link.py's `retrying`: transient failures retried with backoff until stopped."""
        delay_s = FIRST_RETRY_S
        while True:
            try:
                return await self._call(kind, method, path, body, timeout_s=self.settings.request_timeout_s,
                                        token=token)
            except Transient as exc:
                if self.stop.is_set():
                    raise
                await wait_either(self.stop, self.stop, timeout_s=max(delay_s, exc.retry_after_s or 0.0))
                delay_s = min(2 * delay_s, LONGEST_RETRY_S)

    async def _call(self, kind: str, method: str, path: str, body: BaseModel | None, *, timeout_s: float,
                    token: str | None = None) -> str:
        """One request (protocol/http.py's `call`), timed and its outcome recorded."""
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token or self.credential}"}
        data = body.model_dump_json() if body is not None else None
        started_at, started = time.time(), time.perf_counter()
        try:
            async with self.session.request(method, self.settings.url + path, data=data, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                text = await resp.text()
                retry_after = resp.headers.get("Retry-After")
                held_s = float(resp.headers.get("X-Echo2-Held-S", "0") or 0)
        except asyncio.CancelledError:
            self.recorder.outcome(kind, "cut_short", started_at)
            raise
        except TimeoutError as exc:
            self.recorder.outcome(kind, "timeout", started_at)
            raise Transient(f"{path}: no answer within {timeout_s} s") from exc
        except aiohttp.ClientConnectorError as exc:
            self.recorder.outcome(kind, "connect_error", started_at, reason=str(exc.os_error))
            raise Transient(f"{path}: {exc}") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            self.recorder.outcome(kind, "disconnected", started_at, reason=type(exc).__name__)
            raise Transient(f"{path}: {exc!r}") from exc
        took_ms = (time.perf_counter() - started) * 1000.0
        self.recorder.took(kind, started_at, took_ms)
        if kind == "lease":  # its service, apart from the time the coordinator held it waiting for room
            self.recorder.took("lease_served", started_at, max(0.0, took_ms - held_s * 1000.0))
        if resp.status >= 400:
            message = _error_text(text)
            deferred = resp.status == 503 and retry_after is not None
            self.recorder.outcome(kind, "deferred" if deferred else f"http_{resp.status}", started_at, reason=message)
            if resp.status >= 500:
                raise Transient(f"{path}: HTTP {resp.status}: {message}", float(retry_after) if retry_after else None)
            raise Refused(resp.status, message)
        self.recorder.outcome(kind, "ok", started_at)
        return text


LINES: dict[SimWorker, NewsLine] = {}
"""Each simulated worker's open news line."""


async def watch_news_lines(stop: asyncio.Event) -> None:
    """Close every line silent past NEWS_SILENCE_S (its worker opens it again), as each real
    worker's sock_read timeout does for its one line."""
    while not stop.is_set():
        await wait_either(stop, stop, timeout_s=NEWS_SILENCE_S / 4)
        now = time.monotonic()
        for worker, line in list(LINES.items()):
            if now - line.heard_at > NEWS_SILENCE_S:
                LINES.pop(worker, None)
                line.close()


try:  # orjson parses a news line (a version's manifest, kilobytes) several times faster
    from orjson import loads as _loads
except ImportError:  # the json module reads the same lines, in more of the client's time
    _loads = json.loads


def _reply(text: str | bytes) -> dict:
    """A heartbeat reply or news line, read with the json module: a simulated worker reads only
    the few fields it acts on (the real worker validates the whole message), so that thousands
    of them in one client process measure the coordinator, not the client's parsing. A reply
    of another kind or protocol is refused as the real worker's validation would."""
    reply = _loads(text)
    if reply.get("kind") != "heartbeat_ack" or reply.get("protocol") != SPEAKS_PROTOCOL:
        raise ValueError(f"not a protocol {SPEAKS_PROTOCOL} heartbeat reply: {str(text)[:120]}")
    return reply


def _error_text(text: str) -> str:
    try:
        return str(json.loads(text).get("error", text))[:300]
    except (ValueError, AttributeError):
        return text[:300]
