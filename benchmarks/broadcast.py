"""Broadcast benchmark: one-to-many vs pipelined dissemination between real processes, each in its
own Linux network namespace joined by veth pairs and shaped with `tc ... tbf` (the learner's
uplink and every worker's up and down link, 100 Mbit/s by default).

For each payload size and worker count N it runs the one-to-many baseline and the pipelined
broadcast (the latter `--repeats` times; the median counts, all runs are listed), and prints JSON:
measured dissemination time (publish -> last worker verified), the latency model's prediction
for the plan actually used (`echo2.broadcast.latency`), and the ideal M / b. Then it checks the
targets: pipelined <= 1.25 x (M/b + pipeline fill) for every N, one-to-many about linear in N,
and one-to-many / pipelined >= 8 at N = 16.

Where namespaces are unavailable (not root, no iproute2) it says so and runs an unshaped loopback
variant (no model, no targets: loopback is not a bandwidth-limited network).

    sudo .venv/bin/python benchmarks/broadcast.py --tree     # full matrix + d-ary check, ~35 min
    sudo .venv/bin/python benchmarks/broadcast.py --quick    # 16 MiB, N in {2, 4}: ~1 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from echo2.broadcast.lab.experiment import LabSpec, run_lab
from echo2.broadcast.lab.netns import netns_unavailable_reason

MIB = 1 << 20
PIPELINE_SLACK = 1.25
SPEEDUP_AT_16 = 8.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB, N in {2, 4}, one repeat")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--rate-mbit", type=float, default=100.0, help="every shaped link, each direction")
    parser.add_argument("--chunk-kib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3, help="pipelined runs per point (median reported)")
    parser.add_argument("--tree", action="store_true", help="also run N=16 with 4x worker uplinks (d-ary tree)")
    parser.add_argument("--loopback", action="store_true", help="force the unshaped loopback variant")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes_mib, args.workers, args.repeats, args.tree = [16], [2, 4], 1, False
    return args


def run_point(args: argparse.Namespace, shaped: bool, log_dir: Path, **spec: Any) -> dict[str, Any]:
    lab = LabSpec(shaped=shaped, chunk_bytes=args.chunk_kib << 10, origin_up_mbit=args.rate_mbit,
                  worker_down_mbit=args.rate_mbit, **{"worker_up_mbit": args.rate_mbit, **spec})
    started = time.time()
    result = asyncio.run(run_lab(lab, log_dir / f"{lab.mode}-n{lab.n_workers}-{lab.total_bytes // MIB}"))
    print(f"  {lab.mode:12s} N={lab.n_workers:2d} M={lab.total_bytes // MIB}MiB measured={result['measured_s']}"
          f" predicted={result['predicted_s']} ({time.time() - started:.0f}s wall)", file=sys.stderr, flush=True)
    return result


def row(results: list[dict[str, Any]], scenario: str = "equal_links") -> dict[str, Any]:
    """One matrix point: the median run's fields, plus every run's time."""
    ordered = sorted(results, key=lambda r: r["measured_s"] if r["measured_s"] is not None else float("inf"))
    median = ordered[(len(ordered) - 1) // 2]
    keep = ("mode", "n_workers", "total_bytes", "chunk_bytes", "shaped", "measured_s", "predicted_s", "ideal_s",
            "verified", "loaded", "max_depth", "origin_bytes_sent", "relayed_bytes", "all_correct", "failed",
            "resumed_at_chunks")
    out = {"scenario": scenario, **{k: median[k] for k in keep}}
    out["runs_s"] = [r["measured_s"] for r in results]
    if median["predicted_s"]:
        out["measured_over_predicted"] = round(median["measured_s"] / median["predicted_s"], 3)
        out["measured_over_ideal"] = round(median["measured_s"] / median["ideal_s"], 3)
    return out


def check_targets(rows: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    targets: dict[str, Any] = {}
    for size in sizes:
        sized = [r for r in rows if r["total_bytes"] == size * MIB and r["scenario"] == "equal_links"]
        pipe = {r["n_workers"]: r for r in sized if r["mode"] == "pipelined"}
        o2m = {r["n_workers"]: r for r in sized if r["mode"] == "one_to_many"}
        targets[f"{size}MiB"] = {
            "every_worker_verified": all(not r["failed"] and r["all_correct"] for r in sized),
            "pipelined_within_1.25x_model": {n: r["measured_over_predicted"] <= PIPELINE_SLACK and not r["failed"]
                                             for n, r in pipe.items()},
            "one_to_many_linear_fit": linear_fit(o2m),
            "one_to_many_over_pipelined": {n: round(o2m[n]["measured_s"] / pipe[n]["measured_s"], 2)
                                           for n in sorted(pipe) if n in o2m},
        }
        if 16 in pipe and 16 in o2m:
            ratio = o2m[16]["measured_s"] / pipe[16]["measured_s"]
            targets[f"{size}MiB"]["speedup_at_16_ge_8"] = ratio >= SPEEDUP_AT_16
    return targets


def linear_fit(o2m: dict[int, dict[str, Any]]) -> dict[str, float] | None:
    """Least squares t = a + b N over one-to-many points: slope per worker, R^2, and the slope
    relative to the model's M / b_L per worker."""
    if len(o2m) < 2:
        return None
    ns, ts = list(o2m), [o2m[n]["measured_s"] for n in o2m]
    slope, intercept = statistics.linear_regression(ns, ts)
    mean = statistics.fmean(ts)
    residual = sum((t - (intercept + slope * n)) ** 2 for n, t in zip(ns, ts, strict=True))
    total = sum((t - mean) ** 2 for t in ts) or 1.0
    per_copy_s = o2m[ns[0]]["predicted_s"] / ns[0] if o2m[ns[0]]["predicted_s"] else None
    return {"slope_s_per_worker": round(slope, 3), "intercept_s": round(intercept, 3),
            "r_squared": round(1 - residual / total, 4),
            "slope_over_model": round(slope / per_copy_s, 3) if per_copy_s else None}


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # a killed benchmark still stops its processes and deletes its namespaces


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    reason = "--loopback given" if args.loopback else netns_unavailable_reason()
    shaped = reason is None
    if not shaped:
        print(f"shaped netns lab not used ({reason}); running the UNSHAPED loopback variant",
              file=sys.stderr)
    log_dir = Path(tempfile.mkdtemp(prefix="echo2-bcast-bench-"))
    rows = []
    for size in args.sizes_mib:
        for n in args.workers:
            common = dict(n_workers=n, total_bytes=size * MIB)
            rows.append(row([run_point(args, shaped, log_dir, mode="one_to_many", **common)]))
            rows.append(row([run_point(args, shaped, log_dir, mode="pipelined", **common)
                             for _ in range(args.repeats)]))
    if args.tree and shaped:
        tree = dict(n_workers=16, total_bytes=args.sizes_mib[0] * MIB, worker_up_mbit=4 * args.rate_mbit)
        rows.append(row([run_point(args, shaped, log_dir, mode="pipelined", **tree) for _ in range(args.repeats)],
                        scenario="worker_uplink_4x"))
    report = {
        "benchmark": "echo2.broadcast dissemination",
        "environment": {"shaped": shaped, "netns_unavailable_reason": reason, "rate_mbit": args.rate_mbit,
                        "chunk_bytes": args.chunk_kib << 10, "cpus": os.cpu_count(), "repeats": args.repeats,
                        "logs": str(log_dir)},
        "rows": rows,
        "targets": check_targets(rows, args.sizes_mib) if shaped else "not checked: unshaped loopback",
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
