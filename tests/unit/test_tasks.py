"""Task adapters on fixture data: math from JSONL, Parquet and CSV through datasets.load_dataset
(rewards with math-verify, held-out rows never trained on, an epoch order that a restart
continues exactly), reasoning-gym by name and config, the registry's config schemas, and bad
data refused with the file, the row and the field named before a run starts."""

from __future__ import annotations

import csv
import json

import pytest
from tests.unit.task_fixtures import word_problems, write_jsonl, write_parquet

from echo2.cli import main
from echo2.config.run import load_run_config
from echo2.tasks import TASKS, Task, make_task, render_prompt


def _math(path, **extra):
    overrides = ["task.name=math", f"task.dataset={path}", "task.eval_fraction=0.2", "task.eval_size=100"]
    overrides += [f"task.{k}={json.dumps(v)}" for k, v in extra.items()]
    cfg = load_run_config(None, overrides)
    task = make_task(cfg.task, seed=3)
    task.check()
    return task


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_math_task_from_local_files(tmp_path, fmt):
    rows = word_problems(50)
    if fmt == "jsonl":
        path = write_jsonl(tmp_path / "problems.jsonl", rows)
    elif fmt == "parquet":
        path = write_parquet(tmp_path / "problems.parquet", rows)
    else:
        path = tmp_path / "problems.csv"
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["question", "answer"])
            writer.writeheader()
            writer.writerows(rows)
    task = _math(path)
    held = task.eval_problems()
    assert len(held) == 10  # 20% of 50
    train = [task.train_problem(i) for i in range(40)]
    assert {p.prompt for p in train} | {p.prompt for p in held} == {r["question"] for r in rows}
    assert not {p.prompt for p in train} & {p.prompt for p in held}  # held-out rows never trained on
    for problem in train[:12]:
        answer = problem.answer.split("####")[-1].strip()
        assert task.reward(problem, f"Let me think. The answer is \\boxed{{{answer}}}.") == 1.0
        assert task.reward(problem, "The answer is \\boxed{-1}.") == 0.0
    fraction = next(p for p in train if "\\frac" in p.answer)
    denominator = fraction.answer[fraction.answer.rindex("{") + 1:-1]
    assert task.is_correct(fraction, f"each gets {1 / int(denominator)}" if int(denominator) in (2, 4, 5, 8) else
                           f"\\boxed{{1/{denominator}}}")
    gsm = next(p for p in train if "####" in p.answer)
    assert task.is_correct(gsm, f"so it is {gsm.answer.split('####')[-1].strip()}")  # last-number fallback


def test_format_reward_and_instruction(tmp_path):
    task = _math(write_jsonl(tmp_path / "p.jsonl", word_problems(20)), format_reward=0.2)
    problem = next(task.train_problem(i) for i in range(20) if "####" not in task.train_problem(i).answer
                   and "\\frac" not in task.train_problem(i).answer)
    assert task.reward(problem, f"\\boxed{{{problem.answer}}}") == pytest.approx(1.2)
    assert task.reward(problem, f"it is {problem.answer}") == pytest.approx(1.0)
    assert task.reward(problem, "\\boxed{-3}") == pytest.approx(0.2)
    assert "\\boxed{}" in task.messages(problem)[-1]["content"]


def test_epoch_order_is_a_seeded_shuffle_that_a_new_process_repeats(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", word_problems(30))
    task, fresh = _math(path), _math(path)
    first = [task.train_problem(i).prompt for i in range(72)]  # 3 epochs of 24 rows
    again = [fresh.train_problem(i).prompt for i in range(72)]
    assert first == again
    epochs = [first[0:24], first[24:48], first[48:72]]
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)  # every row once per epoch
    assert epochs[0] != epochs[1]  # reshuffled each epoch


def test_a_restarted_coordinator_continues_the_data_order(tmp_path, tiny_model_dir):
    from tests.unit.coordinator_helpers import FakeClock, lease, make_state, publish, register, submission

    from echo2.coordinator.records.store import Store
    from echo2.coordinator.scoring.scorer import Scorer
    from echo2.coordinator.state import CoordinatorState

    path = write_jsonl(tmp_path / "p.jsonl", word_problems(30))
    cfg = load_run_config(None, ["task.name=math", f"task.dataset={path}", "task.eval_fraction=0.2"])

    def state(where):
        base = make_state(where, tiny_model_dir, FakeClock(), max_staleness=100, groups_per_step=1000)
        base.store.close()
        return CoordinatorState(base.cfg, Store(where / "coordinator.db"),
                                Scorer(make_task(cfg.task, cfg.seed), str(tiny_model_dir)), clock=FakeClock())

    def take(s, count):
        """Lease and return `count` prompts (returned ones are not re-leased after a restart)."""
        register(s, "a")
        publish(s, 0)
        prompts = []
        while len(prompts) < count:
            for t in lease(s, "a", 0, max_tasks=min(8, count - len(prompts))).tasks:
                prompts.append(s.scorer.problem(s.leases_book.leases[t.lease_id].prompt_index).prompt)
                assert s.intake.submit(submission(s, "a", t.lease_id, 0)).accepted
        return prompts

    straight = take(state(tmp_path / "straight"), 40)
    first = state(tmp_path / "resumed")
    head = take(first, 16)
    first.store.close()
    tail = take(state(tmp_path / "resumed"), 24)  # a new process: cursor from SQLite, order from the seed
    assert head + tail == straight


@pytest.mark.parametrize("row, message", [
    ({"question": "What is 1+1?"}, "row 3: field 'answer' is missing or empty"),
    ({"question": "", "answer": "2"}, "row 3: field 'question' is missing or empty"),
    ({"question": "What is 1+1?", "answer": None}, "row 3: field 'answer' is missing or empty"),
])
def test_bad_rows_are_named_with_file_row_and_field(tmp_path, row, message):
    rows = word_problems(6)
    rows[3] = row
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=f"task.dataset '{path}', {message}"):
        _math(path)


def test_malformed_jsonl_and_missing_files_are_named(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": \n')
    with pytest.raises(ValueError, match=r"broken.jsonl', line 2: not valid JSON"):
        _math(path)
    with pytest.raises(ValueError, match="does not exist"):
        _math(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="set task.question_field"):
        _math(write_jsonl(tmp_path / "p.jsonl", word_problems(5)), question_field="problem")


def test_bad_data_stops_a_run_before_any_process_starts(tmp_path, capsys):
    rows = word_problems(6)
    rows[4] = {"question": "no answer here"}
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    run_dir = tmp_path / "run"
    code = main(["run", "--set", f"run_dir={run_dir}", "--set", "task.name=math", "--set", f"task.dataset={path}",
                 "--set", "warmstart.steps=0", "--set", "model.source=tiny"])
    assert code == 2
    assert "row 4: field 'answer' is missing or empty" in capsys.readouterr().err
    assert not run_dir.exists()  # nothing prepared, no process started


def test_reasoning_gym_task_is_deterministic_and_scored_by_its_dataset():
    cfg = load_run_config(None, ["task.name=reasoning_gym", "task.dataset=chain_sum", "task.size=500",
                                 "task.eval_size=20", 'task.config={min_terms = 2, max_terms = 2, min_digits = 1, '
                                 'max_digits = 1}'])
    task, again = make_task(cfg.task, seed=1), make_task(cfg.task, seed=1)
    task.check()
    train = [task.train_problem(i) for i in range(50)]
    assert train == [again.train_problem(i) for i in range(50)]
    assert [p.prompt for p in task.eval_problems()] == [p.prompt for p in again.eval_problems()]
    held = {p.prompt for p in task.eval_problems()}
    assert not held & {task.train_problem(i).prompt for i in range(500)}
    problem = train[0]
    assert "arithmetic problem" in problem.prompt
    assert task.reward(problem, problem.answer) == 1.0
    assert task.reward(problem, f"thinking... <answer>{problem.answer}</answer>") == 1.0
    assert task.reward(problem, str(int(problem.answer) + 1)) == 0.0
    assert task.reward(problem, "") == 0.0
    held_problem = task.eval_problems()[0]
    assert task.is_correct(held_problem, held_problem.answer)
    other = make_task(cfg.task, seed=2)
    assert [other.train_problem(i).prompt for i in range(20)] != [p.prompt for p in train[:20]]


def test_reasoning_gym_partial_credit_can_be_turned_off():
    base = ["task.name=reasoning_gym", "task.dataset=basic_arithmetic", "task.size=100", "task.eval_size=10",
            'task.config={min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, operators = ["+"]}']
    shaped = make_task(load_run_config(None, base).task, seed=0)
    binary = make_task(load_run_config(None, [*base, "task.partial_credit=false"]).task, seed=0)
    problem = shaped.train_problem(0)
    habit = f"{problem.prompt.removeprefix('Calculate ').rstrip('.')} = {problem.answer}"  # "2 + 5 = 7"
    assert 0.0 < shaped.reward(problem, habit) < 1.0  # the dataset's len(answer)/len(completion)
    assert binary.reward(problem, habit) == 0.0
    assert shaped.reward(problem, problem.answer) == binary.reward(problem, problem.answer) == 1.0
    held = binary.eval_problems()[0]
    assert binary.is_correct(held, held.answer) and not binary.is_correct(held, f"= {held.answer}")


def test_reasoning_gym_answer_pattern_scores_the_last_match():
    base = ["task.name=reasoning_gym", "task.dataset=basic_arithmetic", "task.size=100", "task.eval_size=10",
            'task.config={min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, operators = ["*"]}',
            "task.partial_credit=false"]
    task = make_task(load_run_config(None, [*base, "task.answer_pattern=-?\\d+"]).task, seed=0)
    problem = task.train_problem(0)
    question = problem.prompt.removeprefix("Calculate ").rstrip(".")  # "4 * 7"
    assert task.reward(problem, f"{question} = {problem.answer}") == 1.0
    assert task.reward(problem, f"{question} = {int(problem.answer) + 10}") == 0.0  # the last integer is wrong
    assert task.reward(problem, "no number here") == 0.0
    assert task.reward(problem, f"1 <answer>{problem.answer}</answer> 2") == 1.0  # a tag wins over the pattern
    grouped = make_task(load_run_config(None, [*base, "task.answer_pattern=answer is (-?\\d+)"]).task, seed=0)
    assert grouped.reward(problem, f"the answer is {problem.answer}, not 3") == 1.0
    with pytest.raises(ValueError, match=r"task.answer_pattern='\(' is not a regular expression"):
        load_run_config(None, [*base, "task.answer_pattern=("])


def test_unknown_reasoning_gym_dataset_is_a_clear_error():
    cfg = load_run_config(None, ["task.name=reasoning_gym", "task.dataset=no_such_dataset"])
    with pytest.raises(ValueError, match="task.dataset='no_such_dataset'.*reasoning-gym refused it"):
        make_task(cfg.task, seed=0).check()


def _math_with_tokenizer(tmp_path, model_dir, *overrides: str):
    from echo2.models.loading import load_tokenizer

    path = write_jsonl(tmp_path / "p.jsonl", word_problems(10))
    cfg = load_run_config(None, ["task.name=math", f"task.dataset={path}", *overrides])
    return make_task(cfg.task, 0), load_tokenizer(str(model_dir)), path


def test_prompts_go_through_the_chat_template_where_the_tokenizer_has_one(tmp_path, tiny_model_dir):
    from echo2.coordinator.scoring.scorer import Scorer

    task, tokenizer, path = _math_with_tokenizer(tmp_path, tiny_model_dir, "task.system_prompt=Be brief.",
                                                 "task.instruction=Answer with a number.")
    problem = task.train_problem(0)
    text = render_prompt(tokenizer, task, problem)
    assert text == (f"<|system|>Be brief.<|end|>\n<|user|>{problem.prompt}\nAnswer with a number.<|end|>\n"
                    "<|assistant|>")
    scorer = Scorer(task, str(tiny_model_dir))  # the coordinator renders it the same way
    assert scorer.prompt_ids(0) == tokenizer.encode(text, add_special_tokens=False)
    plain = make_task(load_run_config(None, ["task.name=math", f"task.dataset={path}",
                                             "task.chat_template=false"]).task, 0)
    assert render_prompt(tokenizer, plain, problem).startswith(problem.prompt + "\nPlease reason step by step")


def test_every_registered_task_has_a_schema_named_like_its_entry():
    for name, (schema, adapter) in TASKS.items():
        assert schema.model_fields["name"].default == name or name in str(schema.model_fields["name"].annotation)
        assert adapter.name == name


VERIFIERS = ["task.environment=echo2.envs.verifiers_examples.addition", "task.trust=replayable"]


@pytest.mark.parametrize("name, kind, extra", [("addition", "single", []), ("poker", "episode", []),
                                               ("guess_number", "episode", []), ("verifiers", "agent", VERIFIERS)])
def test_every_kind_of_task_is_a_task_and_says_which_it_is(name, kind, extra):
    task = make_task(load_run_config(None, [f"task.name={name}", *extra]).task, seed=0)
    assert isinstance(task, Task) and task.kind == kind
    assert {adapter.kind for _, adapter in TASKS.values()} == {"single", "episode", "agent"}


def test_chat_template_variables_reach_the_template(tmp_path, tiny_model_dir):
    task, tokenizer, _ = _math_with_tokenizer(tmp_path, tiny_model_dir, "task.instruction=",
                                              "task.chat_template_kwargs={enable_thinking = false}")
    tokenizer.chat_template = ("{{ messages[-1]['content'] }}|{% if enable_thinking is defined and not "
                               "enable_thinking %}no-think{% else %}think{% endif %}")
    problem = task.train_problem(0)
    assert render_prompt(tokenizer, task, problem) == f"{problem.prompt}|no-think"


def test_the_documented_example_task_works():
    """The 'Adding a task' example of docs/tasks-and-environments.md, as written there, is a
    working adapter."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "tasks-and-environments.md").read_text()
    block = doc.split("# src/echo2/tasks/reverse.py\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(block, "tasks-and-environments.md", "exec", dont_inherit=True), namespace)  # noqa: S102  our own docs
    task = namespace["ReverseTask"](namespace["ReverseConfig"](), 0)
    problem = task.train_problem(1)
    assert task.reward(problem, "renrael") == 1.0 and task.reward(problem, "learner") == 0.0
    assert not {p.prompt for p in task.eval_problems()} & {task.train_problem(i).prompt for i in range(8)}
    assert "backwards" in task.messages(problem)[-1]["content"]


def test_padded_addition_wants_the_answer_after_at_least_its_dots():
    from echo2.config.task import AdditionConfig

    task = make_task(AdditionConfig(pad_tokens=5), seed=0)
    problem = task.train_problem(3)
    assert task.reference_completion(problem) == "......" + problem.answer  # a quarter more: a margin
    assert task.reward(problem, task.reference_completion(problem)) == 1.0
    assert task.reward(problem, "....." + problem.answer) == 1.0
    assert task.reward(problem, "......." + problem.answer + " ") == 1.0  # more dots are fine
    assert task.reward(problem, "...." + problem.answer) == 0.0  # too few: it must take the long way
    assert task.reward(problem, "..x.." + problem.answer) == 0.0
    assert task.reward(problem, "....." + problem.answer + "1") == 0.0
    assert task.reward(problem, problem.answer) == 0.0
    plain = make_task(AdditionConfig(), seed=0)
    assert plain.reward(problem, problem.answer) == 1.0 and plain.reference_completion(problem) == problem.answer


def test_addition_pad_range_puts_the_answer_first_and_draws_each_problems_dots_log_uniform():
    import math

    from echo2.config.task import AdditionConfig

    task = make_task(AdditionConfig(digits=2, pad_range=(40, 320)), seed=0)
    dots = []
    for index in range(400):
        problem = task.train_problem(index)
        count = task.trailing_dots_of(problem)
        assert task.trailing_dots_of(task.train_problem(index)) == count  # one draw per problem, whoever asks
        assert task.reference_completion(problem) == problem.answer + "." * count
        assert task.reward(problem, task.reference_completion(problem)) == 1.0
        dots.append(count)
    values = sorted(dots)
    assert 40 <= values[0] and values[-1] <= 320 and len(set(values)) > 100
    logs = [math.log(v / 40) / math.log(8) for v in values]  # log-uniform: uniform on [0, 1] in log space
    assert 0.4 < sum(logs) / len(logs) < 0.6 and sum(v < 80 for v in values) > 1.5 * sum(v > 240 for v in values)
    problem = task.train_problem(0)
    assert task.reward(problem, problem.answer) == 1.0  # any number of dots, none included
    assert task.reward(problem, " " + problem.answer + "." * 500 + " ") == 1.0
    assert task.reward(problem, problem.answer + "..x") == 0.0  # only dots after the answer
    assert task.reward(problem, "." + problem.answer) == 0.0  # the answer first
    assert task.reward(problem, problem.answer + "1...") == 0.0  # a longer number is another answer
    again = make_task(AdditionConfig(digits=2, pad_range=(40, 320)), seed=0)
    other = make_task(AdditionConfig(digits=2, pad_range=(40, 320)), seed=1)
    first = [task.trailing_dots_of(task.train_problem(i)) for i in range(20)]
    assert [again.trailing_dots_of(again.train_problem(i)) for i in range(20)] == first
    assert [other.trailing_dots_of(task.train_problem(i)) for i in range(20)] != first


def test_addition_pad_range_is_checked():
    from pydantic import ValidationError

    from echo2.config.task import AdditionConfig

    for bad, says in [((0, 10), "1 <= low <= high <= 400"), ((50, 40), "1 <= low <= high <= 400"),
                      ((40, 401), "1 <= low <= high <= 400")]:
        with pytest.raises(ValidationError, match=says):
            AdditionConfig(pad_range=bad)
    with pytest.raises(ValidationError, match="set one of them"):
        AdditionConfig(pad_range=(40, 80), pad_tokens=16)
