"""Quantized targets: a tiny random target quantized in the test (torchao int8 through Transformers' integration),
DFlash lossless against AR of the same quantized target, the pair check, the batch-variance probe, clear errors, and
`dflash-bench --quantize` side by side."""

import json

import pytest
import torch
from conftest import make_drafter, make_target, random_prompt
from test_bench import PROMPTS, VOCAB, char_tokenizer

from transformers_dflash import bench, dflash_generate, quantization
from transformers_dflash.bench_methods import GenerationSettings
from transformers_dflash.bench_quantized import format_comparison, run_quantized_comparison
from transformers_dflash.hub import target_fingerprint
from transformers_dflash.pair_check import check_pair
from transformers_dflash.prompts import write_prompts
from transformers_dflash.quantization import load_quantized_target, probe_batch_variance, quantization_of

torchao = pytest.importorskip("torchao", reason="the 'quant' extra (torchao) is not installed")
MAX_NEW = 24


def _records_target(drafter, target) -> None:
    drafter.config.dflash_config["target"] = {"name_or_path": "tiny-0", "fingerprint": target_fingerprint(target)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Qwen3 target saved in full precision (with a tokenizer), a drafter recording its fingerprint."""
    root = tmp_path_factory.mktemp("quant")
    target = make_target("qwen3", vocab_size=VOCAB)
    target.save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    drafter = make_drafter(target, block_size=4)
    _records_target(drafter, target)
    drafter.save_pretrained(root / "drafter")
    return root, target, drafter


@pytest.fixture(scope="module", params=["int8-weight-only", "int8-dynamic"])
def quantized(request, saved):
    root, _, _ = saved
    return request.param, load_quantized_target(root / "target", request.param)


def test_quantized_through_transformers(quantized, saved):
    method, model = quantized
    _, full, _ = saved
    layer = model.model.layers[0].mlp.up_proj.weight
    assert type(layer).__name__ == "Int8Tensor"  # a real torchao tensor, made by Transformers' TorchAo quantizer
    assert model.lm_head.weight.dtype == torch.float32 and type(model.lm_head.weight) is torch.nn.Parameter
    assert "Int8" in quantization_of(model) and quantization_of(full) is None
    ids = random_prompt(3, 10, VOCAB)
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, full(ids).logits)  # the quantization changes the numbers


def test_dflash_is_lossless_against_ar_of_the_same_quantized_target(quantized, saved):
    """Greedy DFlash (engine and `generate(assistant_model=)`) equals greedy AR of the int8 weight-only target on every
    prompt; with int8 dynamic activations outputs may part, and only where the probe finds the target batch-variant."""
    method, model = quantized
    _, _, drafter = saved
    identical = 0
    for seed in range(4):
        ids = random_prompt(seed, 20, VOCAB)
        ar = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False)
        fast = dflash_generate(model, drafter, ids, max_new_tokens=MAX_NEW).sequences
        native = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False, assistant_model=drafter
        )
        for out in (fast, native):
            if torch.equal(out, ar):
                identical += 1
                continue
            assert method == "int8-dynamic", f"{method} must be lossless (float accumulation, batch-invariant)"
            # where the outputs part, a block forward and 1-token forwards disagree on the greedy token
            part = int((out[0] != ar[0]).nonzero()[0])
            probe = probe_batch_variance(model, ar[:, : part + 1], rows=min(4, part))
            assert not probe.invariant
    assert identical == 8 or method == "int8-dynamic"  # int8-dynamic: any count, each difference explained above


def test_probe_tells_float_accumulation_from_activation_rounding(quantized, saved):
    method, model = quantized
    _, full, _ = saved
    ids = random_prompt(7, 24, VOCAB)
    fp, q = probe_batch_variance(full, ids), probe_batch_variance(model, ids)
    assert fp.invariant and fp.max_abs_diff < 1e-4
    if method == "int8-weight-only":
        assert q.invariant and "batch-invariant" in q.describe()
    else:  # int8 activations magnify float32 noise by orders of magnitude
        assert q.max_abs_diff > 100 * fp.max_abs_diff and "BATCH-VARIANT" in q.describe()
    with pytest.raises(ValueError, match="P > 16"):
        probe_batch_variance(model, ids[:, :10])


def test_pair_check_accepts_a_quantized_copy_and_refuses_another_model(quantized, saved, tmp_path):
    method, model = quantized
    _, target, drafter = saved
    check_pair(model, drafter)
    assert target_fingerprint(model) == target_fingerprint(target)
    other = make_target("qwen3", vocab_size=VOCAB, seed=9)
    other.save_pretrained(tmp_path / "other")
    other_quantized = load_quantized_target(tmp_path / "other", method)
    with pytest.raises(ValueError, match="trained for 'tiny-0'.*embedding differs"):
        check_pair(other_quantized, drafter)
    with pytest.raises(ValueError, match="trained for 'tiny-0'"):
        dflash_generate(other_quantized, drafter, random_prompt(0, 8, VOCAB), max_new_tokens=4)


def test_quantized_embeddings_keep_the_fingerprint(saved, tmp_path):
    """Even with the embedding itself int8 (torchao `quantize_` on it), the pair check passes: the fingerprint reads
    the dequantized rows, and int8 noise stays within its tolerance."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    root, target, drafter = saved
    model = load_quantized_target(root / "target", "int8-weight-only")
    quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda module, fqn: isinstance(module, torch.nn.Embedding))
    assert type(model.get_input_embeddings().weight).__name__ == "Int8Tensor"
    assert target_fingerprint(model) != target_fingerprint(target)  # int8 noise ...
    check_pair(model, drafter)  # ... within the fingerprint's tolerance


@pytest.mark.parametrize(
    ("method", "device", "error", "message"),
    [
        ("int3", "cpu", ValueError, "Unknown quantization method 'int3'; valid: int8-weight-only"),
        ("paroquant", "cpu", ValueError, "ParoQuant checkpoints are made by `paroquant`"),
        ("int4-weight-only", "cpu", ValueError, "runs on cuda, not on cpu; on this device use one of: int8-weight"),
        ("bnb-4bit", "cpu", ValueError, "runs on cuda, not on cpu"),
    ],
)
def test_unsupported_methods_fail_clearly(saved, method, device, error, message):
    root, _, _ = saved
    with pytest.raises(error, match=message):
        load_quantized_target(root / "target", method, device=device)


def test_missing_package_names_the_install(saved, monkeypatch):
    root, _, _ = saved
    real = quantization.importlib.util.find_spec
    monkeypatch.setattr(
        quantization.importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    with pytest.raises(ImportError, match="needs the `torchao` package: `pip install torchao`"):
        load_quantized_target(root / "target", "int8-weight-only")


def test_folder_saved_quantized_loads_as_saved(saved, tmp_path):
    root, _, drafter = saved
    model = load_quantized_target(root / "target", "int8-weight-only")
    model.save_pretrained(tmp_path / "q", safe_serialization=False)
    assert json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["quant_method"] == "torchao"
    assert quantization.prepare_pre_quantized(tmp_path / "q") == "torchao"
    again = load_quantized_target(tmp_path / "q", None)
    ids = random_prompt(1, 12, VOCAB)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="not saved quantized"):
        load_quantized_target(root / "target", None)


def test_comparison_runs_both_targets_side_by_side(saved, tmp_path):
    root, target, drafter = saved
    model = load_quantized_target(root / "target", "int8-weight-only")
    comparison = run_quantized_comparison(
        model, char_tokenizer(), PROMPTS, full_target=target, drafter=drafter, methods=["ar", "dflash"],
        settings=GenerationSettings(max_new_tokens=12), out_dir=tmp_path, progress=False, method="int8-weight-only",
    )  # fmt: skip
    assert comparison.full.complete and comparison.quantized.complete
    assert comparison.quantized.config["quantization"].startswith("torchao Int8")
    assert comparison.full.config["quantization"] is None
    # every prompt turn answered by both targets, both methods; identity checked against each target's own ar
    assert len(comparison.full.samples) == len(comparison.quantized.samples) == 2 * 3
    dflash_rows = [r for r in comparison.rows if r.method == "dflash@b4"]
    assert {r.dataset for r in dflash_rows} == {"chat", "code", "all"}
    for row in dflash_rows:
        assert row.tau_full >= 1 and row.tau_quantized >= 1 and row.tau_share == row.tau_quantized / row.tau_full
        assert row.verify_in_ar_steps_full > 0 and row.verify_in_ar_steps_quantized > 0
        assert row.identical_quantized.endswith("/" + row.identical_quantized.split("/")[1])
    ar_row = next(r for r in comparison.rows if r.method == "ar" and r.dataset == "all")
    assert ar_row.quantized_over_full > 0 and ar_row.identical_full == "reference"
    table = format_comparison(comparison)
    assert "tau int8-weight-only (share)" in table and "batch-invariant" in table
    for name in ("comparison.md", "comparison.json", "full/results.json", "int8-weight-only/results.md"):
        assert (tmp_path / name).is_file(), name


def test_cli_quantize(saved, tmp_path, capsys):
    root, _, _ = saved
    prompts = write_prompts(PROMPTS[1:], tmp_path / "prompts.jsonl")
    common = ["--target", str(root / "target"), "--drafter", str(root / "drafter"), "--dataset", f"jsonl:{prompts}",
              "--max-new-tokens", "8", "--threads", "1", "--no-progress", "--no-warmup", "--methods", "ar,dflash"]  # fmt: skip
    assert bench.main([*common, "--quantize", "int8-dynamic", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "| speed-up full | speed-up int8-dynamic |" in out and "full target:" in out
    assert json.loads((tmp_path / "a" / "comparison.json").read_text())["method"] == "int8-dynamic"
    assert bench.main([*common, "--quantize", "int4-weight-only", "--out", str(tmp_path / "b")]) == 2
    assert "runs on cuda, not on cpu" in capsys.readouterr().err
