"""`echo2 eval`: pass@1 and pass@k of a model on a task's held-out problems, with the code the
learner's in-run evaluation uses. The model is a Hugging Face model directory or hub id (an
`echo2 export` output, a base model) or an echo2 checkpoint (`<run>/checkpoints/step_N`, read
with its run's base model and config). A multi-turn task (poker, guess_number) plays the same
seeded held-out episodes against each of its evaluation opponents and reports mean reward with
a 95% confidence interval, win rate and illegal-action rate. Prints a table, then the result as
JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from echo2.cli.common import add_set_arg


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="pass@k on held-out problems, or reward and win rate on held-out "
                                                "episodes", description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="HF model dir, hub id or .gguf file, or "
                                                            "<run>/checkpoints/step_N")
    parser.add_argument("--config", help="run config TOML for [task] and [sampling] (default: the checkpoint's run's)")
    parser.add_argument("--task", help="shorthand for --set task.name=NAME")
    add_set_arg(parser, "override a field, e.g. --set task.dataset=problems.jsonl (repeatable)")
    parser.add_argument("--n", type=int, default=1, help="completions per problem (default 1)")
    parser.add_argument("--k", default="", help="comma-separated k values for pass@k (default: 1 and n)")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default: 0 for n=1, else 1.0)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the config's sampling.max_new_tokens")
    parser.add_argument("--limit", type=int, help="evaluate only the first N held-out problems (multi-turn tasks: N "
                        "episodes per opponent)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--json", action="store_true", help="print only the JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from echo2.learner.eval_run import load_for_eval, run_eval

    cfg, model_source, checkpoint = _resolve(args)
    n = args.n
    if n < 1:
        raise ValueError(f"--n {n}: expected at least 1 completion per problem")
    temperature = args.temperature if args.temperature is not None else (0.0 if n == 1 else 1.0)
    ks = sorted({1, n, *(int(k) for k in args.k.split(",") if k.strip())})
    if any(k < 1 or k > n for k in ks):
        raise ValueError(f"--k {args.k}: each k must be between 1 and --n {n}")
    model, tokenizer = load_for_eval(model_source, checkpoint, args.device)
    result = run_eval(cfg, model, tokenizer, n=n, temperature=temperature, ks=ks,
                      max_new_tokens=args.max_new_tokens or cfg.sampling.max_new_tokens, limit=args.limit,
                      progress=None if args.json else _progress)
    result = {"checkpoint": args.checkpoint, "task": cfg.task.model_dump(), **result}
    if not args.json:
        _table(result)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def _resolve(args: argparse.Namespace):
    """(run config, model source, echo2 checkpoint dir or None)."""
    from echo2.config.run import load_run_config
    from echo2.config.run_dir import read_resolved, with_overrides

    overrides = ([f"task.name={args.task}"] if args.task else []) + args.overrides
    path = Path(args.checkpoint)
    if (path / "meta.json").is_file() and (path / "model.safetensors").is_file():
        run_dir = path.parent.parent
        base = read_resolved(str(run_dir))
        cfg = load_run_config(args.config, overrides) if args.config else with_overrides(base, overrides)
        return cfg, base.base_model_path, path
    if args.config is None and not overrides:
        raise ValueError("--checkpoint is a model, not an echo2 checkpoint: say which task with --config, --task "
                         "or --set task.name=...")
    from echo2.config.run import ModelConfig
    from echo2.models.sources import check_model_source

    cfg = load_run_config(args.config, overrides)
    model = ModelConfig(source=args.checkpoint)
    check_model_source(model)
    if model.is_gguf:  # dequantized once into the cache, as a run's base model is
        from echo2.models.prepare import prepared_gguf

        return cfg, str(prepared_gguf(model, cfg.cache_dir, log=lambda line: print(line, file=sys.stderr))), None
    return cfg, args.checkpoint, None


def _progress(done: int, total: int) -> None:
    print(f"\reval: {done}/{total} problems", end="" if done < total else "\n", file=sys.stderr, flush=True)


def _table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    if "opponents" in result:
        _episode_table(result)
        return

    table = Table(title=f"echo2 eval: {result['task']['name']}, {result['problems']} held-out problems, "
                        f"n={result['samples_per_problem']}, temperature {result['temperature']}")
    table.add_column("metric")
    table.add_column("value")
    for k, value in result["pass_at_k"].items():
        table.add_row(f"pass@{k}", f"{value:.3f}")
    table.add_row("seconds", f"{result['seconds']:.1f}")
    Console(file=sys.stderr).print(table)


def _episode_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"echo2 eval: {result['task']['name']}, {result['episodes_per_opponent']} held-out episodes "
                        f"per opponent, temperature {result['temperature']}")
    for column in ("opponent", "mean reward (95% CI)", "win rate", "illegal", "turns"):
        table.add_column(column)
    for name, r in result["opponents"].items():
        table.add_row(name, f"{r['mean_reward']:+.3f} +- {r['ci95']:.3f}", f"{r['win_rate']:.3f}",
                      f"{r['illegal_rate']:.3f}", f"{r['mean_turns']:.2f}")
    Console(file=sys.stderr).print(table)
