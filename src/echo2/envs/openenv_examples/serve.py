"""OpenEnv's own server for an example environment, on localhost:

    python -m echo2.envs.openenv_examples.serve --port 8111 [--high 16 --max-guesses 6]

then `task.url = "http://127.0.0.1:8111"` (one such server beside the coordinator and each worker)."""

from __future__ import annotations

import argparse
import functools

import uvicorn
from openenv.core.env_server import create_app

from echo2.envs.openenv_examples.guess import GuessAction, GuessEnvironment, GuessObservation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--high", type=int, default=16)
    parser.add_argument("--max-guesses", type=int, default=6)
    parser.add_argument("--max-sessions", type=int, default=64)
    args = parser.parse_args()
    factory = functools.partial(GuessEnvironment, high=args.high, max_guesses=args.max_guesses)
    app = create_app(factory, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=args.max_sessions)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
