"""dflash-bench on tiny random models: every field, the lossless check, JSON round-trip, plots, CLI and errors."""

import json
import string

import pytest
from conftest import (
    BOS,
    EOS,
    MASK,
    PAD,
    greedy_reference,
    make_drafter,
    make_forced_drafter,
    make_target,
    random_prompt,
)
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from transformers_dflash import bench
from transformers_dflash.bench_methods import (
    METHODS,
    Generation,
    GenerationSettings,
    MethodContext,
    Variant,
    register_method,
    resolve_variants,
)
from transformers_dflash.bench_report import BenchResult
from transformers_dflash.prompts import Prompt, write_prompts

SPECIALS = {"<pad>": PAD, "<eos>": EOS, "<bos>": BOS, "<mask>": MASK, "<unk>": 4}
VOCAB = 128
CHARS = (string.printable[:-5] + "\n" + "".join(map(chr, range(0xC0, 0x200))))[: VOCAB - len(SPECIALS)]
TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a: {% endif %}"
)
METHOD_SPECS = ["ar", "ar-engine", "dflash", "dflash-auto", "dflash-native", "prompt-lookup", "assisted:tiny"]
MAX_NEW = 16


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, the specials at conftest's ids (pad 0, eos 1, bos 2, mask 3)."""
    vocab = dict(SPECIALS) | {c: len(SPECIALS) + i for i, c in enumerate(CHARS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", mask_token="<mask>",
        unk_token="<unk>", chat_template=TEMPLATE,
    )  # fmt: skip


PROMPTS = [
    Prompt("two-turn", "chat", ["Name three colors.", "Now sort them by length."]),
    Prompt("one-turn", "code", ["def add(a, b): return a + b"]),
]


@pytest.fixture(scope="module")
def pair():
    target = make_target("llama", vocab_size=VOCAB)
    return target, make_drafter(target, block_size=4), make_target("llama", vocab_size=VOCAB, seed=5, num_layers=1)


@pytest.fixture(scope="module")
def result(pair, tmp_path_factory):
    target, drafter, assistant = pair
    out = tmp_path_factory.mktemp("bench")
    res = bench.run_benchmark(
        target, char_tokenizer(), PROMPTS, drafter=drafter, methods=METHOD_SPECS, block_sizes=[4, 2],
        settings=GenerationSettings(max_new_tokens=MAX_NEW), assistants={"tiny": assistant}, out_dir=out,
        progress=False,
    )  # fmt: skip
    return res, out


@pytest.fixture
def flip_method():
    """A deliberately broken 'lossless' method: ar's output with one token changed."""

    @register_method("flip", help="broken on purpose")
    def flip(ctx, input_ids, variant):
        ids = METHODS["ar"].run(ctx, input_ids, variant).ids
        ids[len(ids) // 2] = (ids[len(ids) // 2] + 1) % VOCAB
        return Generation(ids)

    yield flip
    del METHODS["flip"]


def test_report_has_every_field(result):
    res, _ = result
    labels = [
        "ar", "ar-engine", "dflash@b4", "dflash@b2", "dflash-auto@b4", "dflash-auto@b2", "dflash-native@b4", "dflash-native@b2",
        "prompt-lookup", "assisted:tiny",
    ]  # fmt: skip
    assert res.methods == labels and res.complete
    assert len(res.samples) == 3 * len(labels)  # 3 prompt turns
    for key in ("cpu", "cpu_count", "torch_threads", "torch", "transformers"):
        assert key in res.machine
    rows = res.summary()
    assert {(r.dataset, r.method) for r in rows} == {(d, m) for d in ("chat", "code", "all") for m in labels}
    for row in rows:
        assert row.median_tokens_per_second > 0 and row.speedup is not None
        if row.method == "ar":
            assert row.tau is None and row.histogram is None and row.checked == 0
        else:
            assert row.tau >= 1 and sum(row.histogram) > 0 and row.checked == row.samples and row.mismatches == 0
        if row.block_size:
            assert len(row.histogram) == row.block_size + 1
    for s in res.samples:
        assert s.new_tokens == len(s.output_ids) and 0 < s.new_tokens <= MAX_NEW and s.seconds > 0
        if s.method.startswith(("dflash-native", "dflash@", "dflash-auto")):  # the prefill's token is no verify step
            assert sum(s.accept_lengths) == s.new_tokens - 1 and max(s.accept_lengths) <= s.block_size
        if s.method.startswith(("dflash@", "dflash-auto")):
            assert {"time_to_first_token_s", "draft_s", "verify_s"} <= set(s.timings)
        if s.method == "ar-engine":  # the same loop, one token per step
            assert s.accept_lengths == [1] * (s.new_tokens - 1)
    # interleaved, rotating order; one seed per prompt turn shared by all methods
    firsts = [res.samples[i * len(labels)].method for i in range(3)]
    assert firsts == labels[:3]
    assert len({(s.key, s.seed) for s in res.samples}) == 3
    table = bench.format_table(res)
    assert all(label in table for label in labels) and "MISMATCH" not in table


@pytest.mark.parametrize("block_size", [4, 2])
def test_native_accept_lengths_are_counted_like_the_engine(block_size):
    target = make_target("llama", vocab_size=48, hidden_size=64)
    ids = random_prompt(3, 6, vocab_size=48)
    reference = greedy_reference(target, ids, 20)
    drafter = make_forced_drafter(target, reference.tolist(), block_size=4, accept_all=True)
    ctx = MethodContext(target, drafter, settings=GenerationSettings(max_new_tokens=20))
    runs = {
        name: METHODS[name].run(ctx, ids, Variant(METHODS[name], None, block_size))
        for name in ("dflash", "dflash-native")
    }
    new = reference[0, ids.shape[1] :].tolist()
    for run in runs.values():
        assert run.ids == new and sum(run.accept_lengths) == len(new) - 1
    assert runs["dflash-native"].accept_lengths == runs["dflash"].accept_lengths
    assert runs["dflash-native"].accept_lengths[:-1] == [block_size] * (len(runs["dflash"].accept_lengths) - 1)
    assert drafter.config.block_size == 4  # restored after the native call


def test_second_turn_follows_ar_answer(result):
    res, _ = result
    second = [s for s in res.samples if s.turn == 1]
    assert len({s.prompt_tokens for s in second}) == 1  # every method saw the same second-turn prompt
    first_ar = next(s for s in res.samples if s.turn == 0 and s.prompt_id == "two-turn" and s.method == "ar")
    assert second[0].prompt_tokens > first_ar.prompt_tokens + len(first_ar.output_ids) - 1


def test_json_round_trips(result):
    res, out = result
    loaded = BenchResult.load_json(out / "results.json")
    assert loaded == res
    data = json.loads((out / "results.json").read_text())
    assert data["summary"] and data["mismatches"] == [] and len(data["samples"]) == len(res.samples)
    assert BenchResult.from_dict(loaded.to_dict()) == res


def test_plots_and_markdown_are_written(result):
    _, out = result
    for name in ("speedup.png", "acceptance.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000
    assert "| dataset | method |" in (out / "results.md").read_text()


def test_lossless_check_catches_a_broken_method(pair, flip_method, capsys):
    target, _, _ = pair
    res = bench.run_benchmark(
        target, char_tokenizer(), PROMPTS[1:], methods=["ar", "flip", "prompt-lookup"],
        settings=GenerationSettings(max_new_tokens=MAX_NEW), warmup=False, progress=False,
    )  # fmt: skip
    assert [s.method for s in res.mismatches] == ["flip"]
    ar = next(s for s in res.samples if s.method == "ar")
    assert res.mismatches[0].first_mismatch == len(ar.output_ids) // 2
    assert "LOSSLESS CHECK FAILED" in capsys.readouterr().err
    assert "MISMATCH 1/1" in bench.format_table(res)
    assert res.to_dict()["mismatches"][0]["method"] == "flip"


def test_sampling_skips_the_identity_check(pair):
    target, drafter, _ = pair
    res = bench.run_benchmark(
        target, char_tokenizer(), PROMPTS[1:], drafter=drafter, methods=["ar", "dflash-native"],
        settings=GenerationSettings(max_new_tokens=8, temperature=0.8, top_k=20), warmup=False, progress=False,
    )  # fmt: skip
    assert all(s.matches_ar is None for s in res.samples) and not res.mismatches


def test_interrupt_keeps_the_samples_so_far(pair, tmp_path):
    target, _, _ = pair
    calls = []

    @register_method("interrupt", help="Ctrl-C on its second call")
    def interrupt(ctx, input_ids, variant):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return METHODS["ar"].run(ctx, input_ids, variant)

    try:
        res = bench.run_benchmark(
            target, char_tokenizer(), PROMPTS, methods=["ar", "interrupt"], out_dir=tmp_path, warmup=False,
            settings=GenerationSettings(max_new_tokens=4), progress=False,
        )  # fmt: skip
    finally:
        del METHODS["interrupt"]
    assert not res.complete
    saved = BenchResult.load_json(tmp_path / "results.json")
    assert saved == res and not saved.complete and len(saved.samples) == 2  # turn 0; turn 1 began with the interrupt
    assert (tmp_path / "speedup.png").is_file()


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["ar", "nope"], "Unknown bench method 'nope'"),
        (["assisted"], "needs an argument"),
        (["ar:x"], "takes no argument"),
        (["ar", "ar"], "listed twice"),
    ],
)
def test_bad_method_names(specs, message):
    with pytest.raises(ValueError, match=message):
        resolve_variants(specs, [4])


def test_bad_block_size_and_missing_drafter(pair):
    with pytest.raises(ValueError, match=">= 2"):
        resolve_variants(["dflash"], [1])
    target, _, _ = pair
    with pytest.raises(ValueError, match="need a DFlash drafter"):
        bench.run_benchmark(target, char_tokenizer(), PROMPTS, methods=["dflash"], block_sizes=[4], progress=False)


@pytest.fixture(scope="module")
def saved_models(pair, tmp_path_factory):
    target, drafter, _ = pair
    root = tmp_path_factory.mktemp("models")
    target.save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    prompts = write_prompts(PROMPTS[1:], root / "prompts.jsonl")
    return root, prompts


def test_cli_end_to_end_and_fail_on_mismatch(saved_models, flip_method, tmp_path, capsys):
    root, prompts = saved_models
    common = ["--target", str(root / "target"), "--drafter", str(root / "drafter"), "--dataset", f"jsonl:{prompts}",
              "--max-new-tokens", "8", "--threads", "1", "--no-progress", "--no-warmup", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main([*common, "--methods", "dflash-native,prompt-lookup", "--block-sizes", "4,3"]) == 0
    out = capsys.readouterr().out
    assert "torch_threads: 1" in out and "dflash-native@b3" in out
    assert BenchResult.load_json(tmp_path / "results.json").config["command"].startswith("dflash-bench --target")
    assert bench.main([*common, "--methods", "ar,flip"]) == 0  # reported, exit code unchanged
    assert "LOSSLESS CHECK FAILED" in capsys.readouterr().err
    assert bench.main([*common, "--methods", "ar,flip", "--fail-on-mismatch"]) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dataset", "nope", "--methods", "ar"], "Unknown prompt set 'nope'"),
        (["--methods", "ar,bogus"], "Unknown bench method 'bogus'"),
        (["--dataset", "jsonl:/nonexistent/prompts.jsonl", "--methods", "ar"], "No such file"),
        (["--drafter", "/nonexistent/drafter"], "No DFlash drafter checkpoint (config.json) in /nonexistent/drafter"),
        ([], "No DFlash drafter checkpoint (config.json) at /nonexistent/embedded"),  # the embedded default
        (["--methods", "assisted:/nonexistent/model"], "not a directory"),
    ],
)
def test_cli_errors_are_clear(saved_models, extra, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_EMBEDDED_DRAFTER", "/nonexistent/embedded")
    root, prompts = saved_models
    args = ["--target", str(root / "target"), "--dataset", f"jsonl:{prompts}", "--out", str(tmp_path), *extra]
    assert bench.main(args) == 2
    err = capsys.readouterr().err
    assert "dflash-bench: error:" in err and message in err.split("dflash-bench: error:")[1]


def test_verify_length_option_parses_every_documented_value(capsys):
    parse = bench.build_parser().parse_args
    assert [parse(["--verify-length", v]).verify_length for v in ("all", "auto", "3")] == [None, "auto", 3]
    assert parse([]).verify_length is None
    with pytest.raises(SystemExit):
        parse(["--verify-length", "every"])
    assert "expected 'all', 'auto' or a positive int" in capsys.readouterr().err


def test_compile_option_reaches_the_engine(pair, monkeypatch):
    from transformers_dflash import engine

    seen = {}

    def fake_generate(*args, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(engine, "dflash_generate", fake_generate)
    target, drafter, _ = pair
    assert bench.build_parser().parse_args(["--compile"]).compile and not bench.build_parser().parse_args([]).compile
    ctx = MethodContext(target, drafter, settings=GenerationSettings(compile=True))
    with pytest.raises(RuntimeError, match="stop here"):
        METHODS["dflash"].run(ctx, random_prompt(0, 5, vocab_size=VOCAB), Variant(METHODS["dflash"], None, 4))
    assert seen["compile"] is True
