"""`echo2 run` with TLS on, over loopback, with certificates from `echo2 certs`: the coordinator,
the learner's origin and every worker's relay serve https, versions reach the workers through
TLS relays, no private key lands in the run dir, and a worker holding the wrong CA stops at once
with a message that names the URL, the failure and the fix. A whole deployment, in the system
tier (`make test-system`); tests/unit/test_tls.py checks each TLS hop in `make test`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import TOKEN, processes, records, wait_for, write_config

from echo2.protocol import certs

pytestmark = [pytest.mark.integration, pytest.mark.system]


def test_a_run_over_tls(tmp_path):
    assert subprocess.run([sys.executable, "-m", "echo2", "certs", "ca", "--out", str(tmp_path / "pki")],
                          capture_output=True, timeout=60).returncode == 0
    assert subprocess.run([sys.executable, "-m", "echo2", "certs", "issue", "--ca-dir", str(tmp_path / "pki"),
                           "--name", "local", "--host", "127.0.0.1", "--host", "localhost"],
                          capture_output=True, timeout=60).returncode == 0
    certs.make_ca(tmp_path / "other")
    tls = {"cert_file": str(tmp_path / "pki/local.pem"), "key_file": str(tmp_path / "pki/local.key"),
           "ca_file": str(tmp_path / "pki/ca.pem")}
    # 12 steps: with 4 the run once ended on one worker's rollouts before any version went through a relay
    cfg = small_run_config(tmp_path / "run", train={"steps": 12, "checkpoint_every": 6, "eval_every": 6}, tls=tls)
    config = write_config(tmp_path / "tls.toml", cfg)
    with processes() as start:
        run = start(["run", "--config", str(config)], tmp_path / "run.log")
        url = wait_for(lambda: _coordinator_url(cfg.run_path), 120, "the coordinator", alive=run)
        assert url.startswith("https://127.0.0.1:")
        refused = subprocess.run(
            [sys.executable, "-m", "echo2", "worker", "--coordinator", url, "--set", "device=cpu",
             "--set", f"tls.ca_file={tmp_path / 'other/ca.pem'}"],
            capture_output=True, text=True, timeout=120, env=_env(),
        )
        assert run.wait(timeout=240) == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"echo2 worker: error: {url}/v1/broadcast_config: TLS certificate verification failed" in refused.stderr
    assert "Fix: set tls.ca_file to the CA that signed" in refused.stderr

    relays = [r["relay_address"] for r in records(cfg.run_path, "worker_registered") if r["role"] == "worker"]
    assert relays and all(a.startswith("https://127.0.0.1:") for a in relays)
    loaded = records(cfg.run_path, "weights_loaded")
    assert any(source != "origin" for r in loaded for source in r["bytes_by_source"])  # through a TLS relay
    assert [r["step"] for r in records(cfg.run_path, "train_step")] == list(range(cfg.train.steps))
    key = (tmp_path / "pki/local.key").read_bytes()
    for path in cfg.run_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert key not in data, path  # only its path is in config.json
            assert b"plain HTTP" not in data, path  # loopback: nothing to warn about


def _coordinator_url(run_dir) -> str | None:
    path = run_dir / "coordinator.json"
    return json.loads(path.read_text())["url"] if path.is_file() else None


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "ECHO2_AUTH_TOKEN": TOKEN}
