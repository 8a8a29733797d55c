"""benchmarks/inflight_model.py: what the in-flight benchmark reads from a run dir, and the
capacity model's and the simulator's predictions it writes beside the measurement."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import inflight_model as model  # noqa: E402

INPUTS = {"prompts_per_step": 4, "group_size": 8, "staleness": 2, "workers": 6, "max_masked_fraction": 1.0,
          "train_s": 2.0, "generation_s": 3.0, "generation_cv": 0.64, "worker_rollouts_per_s": 8 / 3.0,
          "load_s": 0.05, "segment_s": 0.3}


def write_run(run_dir: Path, step_times: list[float]) -> None:
    run_dir.mkdir(parents=True)
    records = [{"kind": "train_step", "role": "learner", "step": i + 1, "time": t, "train_s": 1.5 + 0.1 * i,
                "wait_s": 0.0} for i, t in enumerate(step_times)]
    records += [{"kind": "worker_done", "role": "worker", "worker_id": f"w{i}", "tasks": 10, "rollouts": 80,
                 "tokens": 8000, "gen_s": 30.0, "busy_s": 40.0, "dropped": i} for i in range(2)]
    records += [{"kind": "weights_loaded", "role": "worker", "worker_id": "w0", "version": v, "swap_s": 0.02 * v}
                for v in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.json").write_text(json.dumps({
        "rollouts_dropped_stale": 3, "groups_straddling": 4, "token_staleness_p50": 1, "token_staleness_p95": 3,
        "masked_token_share": 0.125}))


def test_measure_reads_steady_step_time_generation_and_drops(tmp_path):
    write_run(tmp_path / "run", [10.0, 12.0, 14.0, 16.0, 20.0, 23.0, 26.0, 29.0, 32.0])
    measured = model.measure(tmp_path / "run")
    assert measured["steady_step_s"] == 3.0  # from step 5 (t = 20) to step 9 (t = 32): 4 steps
    assert measured["train_s_median"] == pytest.approx(2.1)  # steps 5 to 9: 1.9 ... 2.3
    assert measured["lease_generation_s_mean"] == 3.0 and measured["worker_rollouts_per_s"] == 2.0
    assert measured["tokens_per_rollout"] == 100.0 and measured["workers"] == 2
    assert measured["groups_dropped_on_arrival"] == 1 and measured["groups_dropped_in_buffer"] == 2
    assert (measured["token_staleness_p50"], measured["token_staleness_p95"]) == (1, 3)
    assert measured["swap_s_mean"] == pytest.approx(0.03) and measured["versions_loaded"] == 2
    assert model.steady_step_s([{"step": 1, "time": 0.0}, {"step": 5, "time": 3.0}]) is None  # nothing after 5


def test_capacity_model_prediction_tracks_the_window():
    fits = {**INPUTS, "generation_s": 0.5, "worker_rollouts_per_s": 16.0}  # short generations, ample fleet
    assert model.predict_capacity(fits) == {"step_s": {"between": 2.0, "inflight": 2.0}, "ratio": 1.0}
    long_tail = model.predict_capacity(INPUTS)
    assert long_tail["step_s"]["between"] > long_tail["step_s"]["inflight"] >= 2.0 and long_tail["ratio"] < 0.7
    tighter = model.predict_capacity({**INPUTS, "max_masked_fraction": 0.5})  # fewer stale tokens allowed
    assert tighter["step_s"]["inflight"] > long_tail["step_s"]["inflight"]
    assert tighter["step_s"]["between"] == long_tail["step_s"]["between"]  # f means nothing without swaps


def test_simulator_prediction_runs_both_swap_rules_on_the_measured_inputs():
    predicted = model.predict_sim(INPUTS, (23, 208), steps=40, seeds=(0,))
    assert predicted["step_s"]["between"] >= predicted["step_s"]["inflight"] >= 2.0
    assert predicted["ratio"] == pytest.approx(predicted["step_s"]["inflight"] / predicted["step_s"]["between"],
                                               abs=1e-3)


def test_accuracy_guard_and_lengths_spread():
    close = model.accuracy_guard({"accuracy": 0.50, "problems": 500}, {"accuracy": 0.53, "problems": 500})
    assert close["within_2_sd"] and close["difference"] == 0.03 and close["sd"] == pytest.approx(0.0316, abs=1e-4)
    far = model.accuracy_guard({"accuracy": 0.50, "problems": 500}, {"accuracy": 0.60, "problems": 500})
    assert not far["within_2_sd"]
    assert model.lengths_cv([10, 10, 10]) == 0.0 and model.lengths_cv([1, 3]) == 0.5


def test_goals_read_every_seed():
    import inflight

    def comparison(measured, predicted, between_drops, inflight_drops, within=True):
        return {"ratio_measured": measured, "ratio_capacity_model": predicted,
                "groups_dropped_on_arrival": {"between": between_drops, "inflight": inflight_drops},
                "accuracy_at_fixed_versions": {"30": {"within_2_sd": within}}}

    met = inflight.goals([comparison(0.62, 0.60, 3, 0), comparison(0.70, 0.64, 1, 0)])
    assert met["goal_1_between_drops_on_arrival_inflight_none"] and met["goal_2_ratio_at_most_0_75"]
    assert met["goal_2_within_15_percent_of_capacity_model"] and met["capacity_model_predicts_at_most_0_65"]
    assert met["ratio_measured_median"] == 0.66 and met["accuracy_within_2_sd"]
    missed = inflight.goals([comparison(0.62, 0.60, 3, 0), comparison(0.88, 0.56, 0, 1, within=False)])
    assert not missed["goal_1_between_drops_on_arrival_inflight_none"]  # one seed's baseline dropped none
    assert not missed["goal_2_ratio_at_most_0_75"] and not missed["goal_2_within_15_percent_of_capacity_model"]
    assert missed["capacity_model_predicts_at_most_0_65"] and not missed["accuracy_within_2_sd"]
    assert inflight.goals([comparison(None, 0.6, 1, 0)])["ratio_measured_median"] is None


def test_inputs_come_from_the_baseline_run():
    import inflight

    between = {"lease_generation_s_mean": 3.0, "tokens_per_rollout": 80.0, "train_s_median": 2.1,
               "worker_rollouts_per_s": 2.5, "swap_s_mean": None}
    inputs = inflight.inputs_of(between, 0.64)
    assert inputs["segment_s"] == round(3.0 / 80.0 * inflight.SEGMENT_TOKENS, 4) and inputs["load_s"] == 0.0
    assert (inputs["train_s"], inputs["generation_s"], inputs["generation_cv"]) == (2.1, 3.0, 0.64)
    assert model.predict_capacity(inputs)["ratio"] is not None
