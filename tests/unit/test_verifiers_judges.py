"""LLM judges of verifiers environments run only on the side that can be trusted: an environment
that plugs judges is refused without `[task.judge]`; with it, the coordinator's replay and the
learner's evaluation call that endpoint for the reward, while a worker plays with the judges
taken out, never calls the endpoint and is never told it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("verifiers.v1")

from tests.unit.test_verifiers_play import scripted  # noqa: E402

from echo2.config.run import load_run_config  # noqa: E402
from echo2.envs.verifiers_env import EnvironmentLoadError  # noqa: E402
from echo2.tasks import make_task  # noqa: E402

JUDGED = "task.environment=tests.unit.vf_judged_env"


class FakeJudge(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint whose verdict is "yes" when the graded reply says RIGHT."""

    calls: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeJudge.calls.append({"path": self.path, "model": body["model"], "auth": self.headers.get("Authorization")})
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
        verdict = "yes" if "RIGHT" in text.split("Response", 1)[-1] else "no"
        message = {"role": "assistant", "content": verdict}
        reply = {"id": "j", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeJudge.calls = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _task(*overrides: str):
    cfg = load_run_config(None, ["task.name=verifiers", JUDGED, "task.trust=replayable", "task.eval_size=2",
                                 *overrides])
    return make_task(cfg.task, seed=0)


def test_an_environment_with_judges_and_no_endpoint_is_refused_before_the_run():
    with pytest.raises(EnvironmentLoadError, match=r"scores with LLM judges \(reference\): set \[task.judge\]"):
        _task().check()
    with pytest.raises(ValueError, match="task.judge.base_url"):
        _task("task.judge={base_url = 'ftp://judge', model = 'm'}")


def test_the_coordinator_scores_with_the_judge_and_the_worker_never_calls_it(judge_url, tiny_model_dir, monkeypatch):
    from transformers import PreTrainedTokenizerFast

    from echo2.coordinator.scoring.agent_replay import AgentScorer

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
    monkeypatch.setenv("ECHO2_JUDGE_API_KEY", "sk-judge")
    task = _task(f"task.judge={{base_url = '{judge_url}', model = 'grader-1', timeout_s = 20}}")
    task.check()
    model = str(tiny_model_dir)
    with task.episodes(model, 16, run_judges=False) as worker:  # what a worker plays with
        played = worker.play([2, 2], scripted(tokenizer, lambda k, _: "RIGHT" if k == 0 else "WRONG"))
    assert FakeJudge.calls == [] and [e.reward for e in played] == [0.0, 0.0]  # no judge: no reward, no call
    scorer = AgentScorer(task, model, 16)
    assert scorer.task_config().judge is None and task.cfg.judge is not None  # workers are not told the endpoint
    prompt_index = next(i for i in range(20) if task.train_index(i) == 2)
    rewards = [scorer.reward_of(prompt_index, e.token_ids, e.segments) for e in played]
    assert rewards == [1.0, 0.0]  # the judge's verdicts on the replayed episodes
    assert len(FakeJudge.calls) == 2
    assert all(c["model"] == "grader-1" and c["auth"] == "Bearer sk-judge" and c["path"] == "/v1/chat/completions"
               for c in FakeJudge.calls)
