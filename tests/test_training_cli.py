"""`dflash-train`: help text, and the train + export stages under `accelerate launch --num_processes 2`.

On a CPU machine `accelerate launch --multi_gpu` starts torchrun-style processes and the trainer (which asks for the CPU
when torch sees no accelerator) joins them over gloo; `--cpu` would start a single process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import MASK, make_drafter, make_target, write_responses
from safetensors.torch import load_file

from transformers_dflash.draft_vocab import load_draft_vocab
from transformers_dflash.training import cli
from transformers_dflash.training.checkpoint import list_checkpoints, read_state
from transformers_dflash.training.cli import build_parser, main
from transformers_dflash.training.export import record_target


def test_help_explains_every_stage_and_the_paper_scale(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    for stage in ("prompts", "responses", "features", "train", "export", "all"):
        assert stage in top
    assert "--num-anchors 512" in top and "--max-seq-len 3072" in top and "--epochs 6" in top
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    train = capsys.readouterr().out
    for flag in ("--restricted-vocab", "--num-anchors", "--gradient-checkpointing", "--labels", "--stop-after"):
        assert flag in train


def test_all_stage_has_every_flag() -> None:
    args = build_parser().parse_args(["all", "--num-prompts", "4", "--gen-batch-size", "2", "--epochs", "1"])
    assert (args.num_prompts, args.gen_batch_size, args.epochs, args.restricted_vocab) == (4, 2, 1, True)


def test_several_response_files_are_read_with_distinct_ids(tmp_path) -> None:
    row = {"id": "gsm8k:1", "prompt_ids": [4, 5], "response_ids": [6, 7, 8, 9, 10]}
    for name in ("regenerated", "reference"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    flags = [
        "train",
        "--responses",
        str(tmp_path / "regenerated.jsonl"),
        "--responses",
        str(tmp_path / "reference.jsonl"),
    ]
    seqs = cli._sequences(build_parser().parse_args(flags), block_size=4)
    assert [s.id for s in seqs] == ["regenerated:gsm8k:1", "reference:gsm8k:1"]
    assert cli._sequences(build_parser().parse_args([*flags, "--max-sequences", "1"]), block_size=4)[0].id.startswith(
        "re"
    )


LAUNCHER = os.path.join(os.path.dirname(sys.executable), "accelerate")


@pytest.mark.skipif(not os.path.exists(LAUNCHER), reason="the accelerate launcher is not installed beside python")
def test_accelerate_launch_two_processes_trains_and_saves(tmp_path) -> None:
    target = make_target("llama")
    target.save_pretrained(tmp_path / "target")
    work = write_responses(tmp_path / "run", 8)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    common = ["--target", str(tmp_path / "target"), "--work-dir", str(work)]
    train = [
        LAUNCHER, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "-m", "transformers_dflash.training.cli", "train", *common,
        "--mask-token-id", str(MASK), "--draft-layers", "1", "--target-features", "2", "--block-size", "4",
        "--num-anchors", "4", "--epochs", "2", "--eval-prompts", "0", "--log-every", "1",
    ]  # fmt: skip
    # generous: two launched processes on a loaded 2-core host have taken minutes; the run itself is small
    result = subprocess.run(train, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoints = list_checkpoints(work / "checkpoints")
    assert [c.name for c in checkpoints] == ["step-00000004", "step-00000008"]  # 8 sequences / 2 processes / epoch
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in checkpoints[-1].iterdir()}
    state = read_state(checkpoints[-1])
    assert state["step"] == 8 and state["run_info"]["hardware"].startswith("2 x CPU")
    log = [json.loads(line) for line in (work / "train_log.jsonl").read_text().splitlines()]
    assert sum(r["event"] == "train" for r in log) == 8  # only the main process writes
    main(["export", *common, "--export-dtype", "float16"])  # in-process: the launch above is the slow part
    assert (work / "export" / "README.md").is_file()
    weights = load_file(work / "export" / "model.safetensors")
    assert {w.dtype for w in weights.values()} == {torch.float16}
    # the loss scored the response tokens (and eos) only: the exported drafter drafts over exactly those
    responses = {
        t for line in (work / "responses.jsonl").read_text().splitlines() for t in json.loads(line)["response_ids"]
    }
    vocab = set(load_draft_vocab(work / "export").tolist())
    assert responses <= vocab and len(vocab - responses) <= 1


def test_init_from_starts_from_a_saved_drafter_and_refuses_another_targets(tmp_path) -> None:
    target, other = make_target("llama"), make_target("llama", seed=5)
    target.save_pretrained(tmp_path / "target")
    other.save_pretrained(tmp_path / "other")
    init = make_drafter(target, block_size=4, num_layers=1, features=2)
    init.set_draft_vocab(torch.tensor([90, 91]))
    record_target(init.config, target)
    init.save_pretrained(tmp_path / "init")
    work = write_responses(tmp_path / "run", 2)
    flags = ["train", "--work-dir", str(work), "--init-from", str(tmp_path / "init"), "--num-anchors", "4"]
    flags += ["--epochs", "1", "--eval-prompts", "0", "--lr", "0", "--weight-decay", "0"]  # lr 0: weights unchanged
    main([*flags, "--target", str(tmp_path / "target")])
    checkpoint = list_checkpoints(work / "checkpoints")[-1]
    saved = load_file(checkpoint / "model.safetensors")
    assert set(saved) == set(init.state_dict())  # the init's shape (1 layer, 2 features), not the flags' defaults
    for name, weight in init.state_dict().items():
        assert torch.equal(saved[name], weight), name
    assert read_state(checkpoint)["run_info"]["initialised from"] == str(tmp_path / "init")
    responses = {
        t for line in (work / "responses.jsonl").read_text().splitlines() for t in json.loads(line)["response_ids"]
    }
    assert responses | {90, 91} <= set(load_draft_vocab(checkpoint).tolist())  # the init's vocabulary is kept
    with pytest.raises(ValueError, match="trained for"):
        main([*flags, "--target", str(tmp_path / "other"), "--work-dir", str(tmp_path / "run2")])


def test_target_runs_where_device_says(tmp_path) -> None:
    make_target("llama").save_pretrained(tmp_path / "target")
    auto = cli.load_target(build_parser().parse_args(["responses", "--target", str(tmp_path / "target")]))[0]
    assert auto.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    flags = ["features", "--target", str(tmp_path / "target"), "--device", "meta"]  # any torch device name
    assert cli.load_target(build_parser().parse_args(flags))[0].device.type == "meta"
