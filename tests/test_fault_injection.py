"""Fault injection: damaged checkpoints, damaged data files, bad requests and killed runs get a clear refusal that
names the file, the field and the fix, or the right behaviour; never a crash deep in a library or a silent change.

Every damaged file is written here, from tiny random models (issue 22's probes, one test or case each).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import MASK, greedy_reference, make_drafter, make_target, random_prompt
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from transformers_dflash import DFlashConfig, DFlashDraftModel, dflash_generate, fast_generate
from transformers_dflash.prompts import load_prompts
from transformers_dflash.training import cli
from transformers_dflash.training.checkpoint import latest_checkpoint, list_checkpoints
from transformers_dflash.training.data import read_responses
from transformers_dflash.training.sequences import TrainingSequence
from transformers_dflash.training.trainer import LOG_FILE, DFlashTrainer, TrainConfig


@pytest.fixture(scope="module")
def pair():
    target = make_target("qwen3")
    return target, make_drafter(target, block_size=4)


@pytest.fixture
def saved(pair, tmp_path) -> Path:
    """A freshly saved drafter folder, to damage."""
    pair[1].save_pretrained(tmp_path / "drafter")
    return tmp_path / "drafter"


def _edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def _damage(folder: Path, case: str) -> None:
    weights = folder / "model.safetensors"
    if case == "no config":
        (folder / "config.json").unlink()
    elif case == "config not JSON":
        (folder / "config.json").write_text("{ not json")
    elif case == "string for a number":
        _edit_config(folder, lambda c: c.update(num_hidden_layers="two"))
    elif case == "nested string":
        _edit_config(folder, lambda c: c["dflash_config"].update(mask_token_id="3"))
    elif case == "layer_types disagree":
        _edit_config(folder, lambda c: c.update(num_hidden_layers=4))
    elif case == "more layers than weights":
        _edit_config(folder, lambda c: (c.update(num_hidden_layers=4), c.pop("layer_types")))
    elif case == "fewer layers than weights":
        _edit_config(folder, lambda c: (c.update(num_hidden_layers=1), c.pop("layer_types")))
    elif case == "shape mismatch":
        _edit_config(folder, lambda c: c.update(intermediate_size=8))
    elif case == "no block_size":
        _edit_config(folder, lambda c: c.pop("block_size"))
    elif case == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif case == "truncated header":
        weights.write_bytes(weights.read_bytes()[:100])
    elif case == "pickle only":
        torch.save(load_file(weights), folder / "pytorch_model.bin")
        weights.unlink()
    elif case == "does not exist":
        shutil.rmtree(folder)
    else:
        raise ValueError(case)


DAMAGE = {  # case -> what the error must say (the file or path, the field, the fix)
    "no config": r"drafter has no config\.json.*save_pretrained writes it",
    "config not JSON": r"config\.json is not valid JSON.*restore it",
    "string for a number": r"config\.json: field 'num_hidden_layers' must be an integer, got 'two'",
    "nested string": r"config\.json: field 'dflash_config\.mask_token_id' must be an integer",
    "layer_types disagree": r"config\.json: 'layer_types' lists 2 layers but 'num_hidden_layers' is 4",
    "more layers than weights": r"model\.safetensors lacks .*hold 2 decoder layers .*num_hidden_layers=4",
    "fewer layers than weights": r"model\.safetensors holds decoder layers up to 1 .*set num_hidden_layers to 2",
    "shape mismatch": r"model\.safetensors: tensor layers\.0\.mlp\.\w+_proj\.weight has shape",
    "no block_size": r"config\.json has no 'block_size'.*not guessed.*\"block_size\"",
    "truncated weights": r"drafter/model\.safetensors is damaged or truncated.*save the checkpoint again",
    "truncated header": r"drafter/model\.safetensors is damaged or truncated.*header",
    "pickle only": r"pickle weights only \(pytorch_model\.bin\).*allow_pickle=True",
    "does not exist": r"No drafter folder at .*drafter: the path does not exist",
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_drafter_folder_is_refused_before_anything_is_allocated(saved, case) -> None:
    _damage(saved, case)
    with pytest.raises((OSError, ValueError), match=DAMAGE[case]):
        DFlashDraftModel.from_pretrained(saved)


def test_block_size_is_read_from_every_dialect_never_defaulted(saved) -> None:
    _edit_config(saved, lambda c: c["dflash_config"].update(block_size=c.pop("block_size")))
    assert DFlashDraftModel.from_pretrained(saved).config.block_size == 4  # nested (newer z-lab checkpoints)
    _edit_config(saved, lambda c: c["dflash_config"].pop("block_size"))
    with pytest.raises(ValueError, match="no 'block_size'"):
        DFlashConfig.from_pretrained(saved)  # the config alone is refused too (dflash-train reads it this way)


def test_weights_overwritten_in_the_middle_are_refused_on_load(saved) -> None:
    weights = saved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff" * 64  # same length, NaN bit patterns
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"hold NaN or Inf values in \['.*'\].*damaged"):
        DFlashDraftModel.from_pretrained(saved)


def test_a_pickle_folder_loads_with_the_opt_in(pair, saved) -> None:
    _damage(saved, "pickle only")
    loaded = DFlashDraftModel.from_pretrained(saved, allow_pickle=True)
    for name, value in pair[1].state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


# ---- data files -------------------------------------------------------------------------------------------------


def _rows(count: int, response: int = 10, first: int = 0) -> list[dict]:
    return [
        {"id": f"r{i}", "prompt_ids": [4, 5, 6], "response_ids": list(range(7, 7 + response))}
        for i in range(first, first + count)
    ]


def _write_jsonl(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def test_a_garbage_line_names_the_file_and_its_line(tmp_path) -> None:
    rows = [json.dumps(r) + "\n" for r in _rows(4)]
    rows.insert(2, "\n")  # a blank line is skipped, and counted in the line numbers
    rows.insert(3, "this is not json\n")
    (tmp_path / "responses.jsonl").write_text("".join(rows))
    with pytest.raises(ValueError, match=r"responses\.jsonl:4: not valid JSON .*fix or delete that line"):
        read_responses(tmp_path / "responses.jsonl")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"prompts\.jsonl:2: a row must be a JSON object"):
        load_prompts(f"jsonl:{prompts}")
    prompts.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match=r"prompts\.jsonl:2: a row needs a 'prompt'"):
        load_prompts(f"jsonl:{prompts}")


def test_a_row_without_response_ids_is_named(tmp_path) -> None:
    rows = _rows(3)
    del rows[1]["response_ids"]
    _write_jsonl(tmp_path / "responses.jsonl", rows)
    with pytest.raises(ValueError, match=r"responses\.jsonl:2: the row has no 'response_ids'.*responses stage"):
        read_responses(tmp_path / "responses.jsonl")
    rows[1]["response_ids"] = "7 8 9"
    _write_jsonl(tmp_path / "responses.jsonl", rows)
    with pytest.raises(ValueError, match=r"responses\.jsonl:2: 'response_ids' must be a list, got str"):
        read_responses(tmp_path / "responses.jsonl")


def test_a_cut_off_last_line_is_dropped_with_a_notice_and_a_count(tmp_path, capsys) -> None:
    path = _write_jsonl(tmp_path / "responses.jsonl", _rows(15), tail='{"id": "r15", "prompt_ids": [4, 5')
    assert [r["id"] for r in read_responses(path)] == [f"r{i}" for i in range(15)]
    notice = capsys.readouterr().err
    assert "responses.jsonl: dropped line 16, cut off mid-write" in notice and "kept 15 rows" in notice


def test_rows_too_short_for_a_block_are_counted_in_the_summary(tmp_path, capsys) -> None:
    rows = _rows(3) + _rows(2, response=2, first=3)
    _write_jsonl(tmp_path / "responses.jsonl", rows)
    args = cli.build_parser().parse_args(["train", "--work-dir", str(tmp_path)])
    assert len(cli._sequences(args, block_size=4)) == 3
    assert "3 training sequences from 5 response rows; 2 dropped: response shorter than one block of 4" in (
        capsys.readouterr().err
    )


def test_a_repeated_response_id_is_refused_naming_it(tmp_path) -> None:
    _write_jsonl(tmp_path / "responses.jsonl", _rows(3) + _rows(1))  # ids key the feature cache: one row each
    args = cli.build_parser().parse_args(["train", "--work-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="Response id 'r0' occurs twice .*drop the repeated rows"):
        cli._sequences(args, block_size=4)


# ---- requests ---------------------------------------------------------------------------------------------------


def test_bad_engine_requests_are_refused_with_the_fix(pair) -> None:
    target, drafter = pair
    ids = random_prompt(0, 5)
    with pytest.raises(ValueError, match=r"max_new_tokens must be >= 1, an int .*got None"):
        dflash_generate(target, drafter, ids, max_new_tokens=None)
    with pytest.raises(ValueError, match=r"integer token ids, got dtype torch\.float32.*ids\.long\(\)"):
        dflash_generate(target, drafter, ids.float(), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"\.\.96, outside the target's vocabulary \[0, 96\).*tokenizer"):
        dflash_generate(target, drafter, torch.cat([ids, torch.tensor([[96]])], dim=1), max_new_tokens=4)


def _word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose token i is the word `w{i}` (ids match the tiny targets' vocabulary)."""
    words = {f"w{i}": i for i in range(vocab_size)} | {"abcdef": vocab_size}  # generate's stop-string probe word
    backend = Tokenizer(models.WordLevel(words, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", pad_token="w0", eos_token="w1")


def test_fast_generate_honours_stop_strings_with_the_tokenizer_given_to_generate(pair) -> None:
    target, drafter = pair
    tokenizer = _word_tokenizer(96)
    ids = random_prompt(3, 6)
    free = greedy_reference(target, ids, 16)[0, 6:].tolist()
    stop = f"w{free[5]}"  # a word the target writes: generation ends right after its first occurrence
    kwargs = dict(max_new_tokens=16, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert expected.shape[1] < 6 + 16  # the stop string cut it
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), custom_generate=fast_generate, drafter=drafter, **kwargs
    )
    assert torch.equal(out, expected)


# ---- killed and resumed runs ------------------------------------------------------------------------------------


def _trainer(work: Path, target, sequences, **overrides) -> DFlashTrainer:
    config = TrainConfig(str(work), epochs=2, batch_size=2, num_anchors=6, log_every=1, save_every=2, **overrides)
    return DFlashTrainer(target, make_drafter(target, block_size=4, seed=5), sequences, config)


def test_a_killed_train_resumes_from_the_newest_complete_checkpoint_to_the_same_weights(tmp_path, capsys) -> None:
    target = make_target("qwen3")
    sequences = [TrainingSequence(f"s{i}", random_prompt(i, 30)[0], 8) for i in range(8)]  # 4 steps per epoch
    straight = _trainer(tmp_path / "a", target, sequences)
    straight.train()
    killed = _trainer(tmp_path / "b", target, sequences, stop_after=5)
    killed.train()  # checkpoints at 4 and 5, log records for steps 1..5
    (tmp_path / "b" / "checkpoints" / "step-00000005" / "model.safetensors").unlink()  # its weights are lost
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step-00000004"
    assert "skipping the incomplete checkpoint" in capsys.readouterr().err
    resumed = _trainer(tmp_path / "b", target, sequences)
    resumed.train()
    assert "step-00000005 (model.safetensors missing)" in capsys.readouterr().err
    expected = straight.accelerator.unwrap_model(straight.model).state_dict()
    for name, value in resumed.accelerator.unwrap_model(resumed.model).state_dict().items():
        torch.testing.assert_close(value, expected[name], atol=0, rtol=0, msg=name)
    log = [json.loads(line) for line in (tmp_path / "b" / LOG_FILE).read_text().splitlines()]
    assert [r["step"] for r in log if r["event"] == "train"] == list(range(1, 9))  # one record per step
    assert [r["step"] for r in log if r["event"] == "resume"] == [4]
    straight_log = [json.loads(line) for line in (tmp_path / "a" / LOG_FILE).read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in straight_log if r["event"] == "train"}
    assert {r["step"]: r["loss"] for r in log if r["event"] == "train"} == losses


def test_resuming_under_other_settings_is_refused_with_the_two_ways_on(tmp_path) -> None:
    target = make_target("llama")
    target.save_pretrained(tmp_path / "target")
    work = tmp_path / "run"
    work.mkdir()
    _write_jsonl(
        work / "responses.jsonl",
        [{**r, "response_ids": random_prompt(i, 22)[0].tolist()} for i, r in enumerate(_rows(4))],
    )
    flags = ["train", "--target", str(tmp_path / "target"), "--mask-token-id", str(MASK), "--draft-layers", "1"]
    flags += [
        "--target-features",
        "2",
        "--block-size",
        "4",
        "--num-anchors",
        "4",
        "--epochs",
        "2",
        "--eval-prompts",
        "0",
    ]
    cli.main([*flags, "--work-dir", str(work), "--stop-after", "1"])
    checkpoint = list_checkpoints(work / "checkpoints")[-1]
    for changed, named in ((["--lr", "0.1"], "--lr 0.1"), (["--block-size", "8"], "--block-size 8 (the run: 4)")):
        with pytest.raises(ValueError, match="differ from it") as refused:
            cli.main([*flags, *changed, "--work-dir", str(work)])
        message = str(refused.value)
        assert named in message and "new --work-dir" in message and f"--init-from {checkpoint}" in message
    assert list_checkpoints(work / "checkpoints") == [checkpoint]  # nothing was written
    cli.main(
        [*flags, "--work-dir", str(work), "--stop-after", "2", "--log-every", "1"]
    )  # bookkeeping flags may differ
    assert list_checkpoints(work / "checkpoints")[-1].name == "step-00000002"
    cli.main(
        [
            *flags,
            "--lr",
            "0.1",
            "--work-dir",
            str(tmp_path / "new"),
            "--init-from",
            str(checkpoint),
            "--responses",
            str(work / "responses.jsonl"),
        ]
    )
    state = json.loads((list_checkpoints(tmp_path / "new" / "checkpoints")[-1] / "trainer_state.json").read_text())
    assert state["config"]["learning_rate"] == 0.1 and state["run_info"]["initialised from"] == str(checkpoint)
