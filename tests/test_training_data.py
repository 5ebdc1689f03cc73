"""Training data: prompt mixing, held-out split, regeneration (local and through a fake OpenAI server)."""

import json
import lzma
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from transformers_dflash.prompts import Prompt, load_prompts, write_prompts
from transformers_dflash.training import data as D
from transformers_dflash.training.arguments import build_parser
from transformers_dflash.training.cli import main, stage_prompts
from transformers_dflash.training.magpie import magpie_prompts
from transformers_dflash.training.sequences import sequences_from_responses

WORDS = [f"w{i}" for i in range(40)]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        chat_template=TEMPLATE,
    )


@pytest.fixture(scope="module")
def target(tokenizer) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.3,  # large enough for varied, non-degenerate greedy outputs
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config).eval()


def _prompts(n: int, dataset: str = "src") -> list[Prompt]:
    return [
        Prompt(f"{dataset}-{i}", dataset, [" ".join(WORDS[(i * 7 + j) % 40] for j in range(1 + i % 5))])
        for i in range(n)
    ]


def _reference(target, tokenizer, prompt, max_new_tokens, eos_ids):
    ids = tokenizer(D.chat_text(tokenizer, prompt), add_special_tokens=False, return_tensors="pt").input_ids
    out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_ids, pad_token_id=1)
    new = out[0, ids.shape[1] :].tolist()
    end = next((i + 1 for i, t in enumerate(new) if t in eos_ids), None)
    return new[:end] if end else new


def test_dedupe_normalises_case_and_whitespace():
    items = [Prompt("a", "s", ["Hello  World"]), Prompt("b", "s", ["hello world\n"]), Prompt("c", "s", ["hi"])]
    assert [p.id for p in D.dedupe(items)] == ["a", "c"]


def test_decontaminate_drops_shared_ngrams():
    words = " ".join(f"x{i}" for i in range(20))
    bench = [Prompt("HumanEval/0", "humaneval", [f"solve {words} please"])]
    items = [Prompt("leak", "s", [f"now {words}"]), Prompt("ok", "s", ["x0 x1 x2 other words entirely"])]
    assert [p.id for p in D.decontaminate(items, bench)] == ["ok"]


def test_decontaminate_drops_copies_of_short_prompts():
    # fewer than 13 words has no 13-gram: a copy of such a prompt must still be caught
    bench = [Prompt("old/1", "s", ["Write a haiku about rain."])]
    items = [Prompt("copy", "s", ["write a  HAIKU about rain"]), Prompt("other", "s", ["Write a haiku about snow."])]
    assert [p.id for p in D.decontaminate(items, bench)] == ["other"]


def test_decontaminate_ignores_template_ngrams_shared_by_many_excluded_prompts():
    # GSM8K prompts end in the same 12-word instruction: with a common last word, a 13-gram that says nothing
    suffix = " left? Please reason step by step, and put your final answer within \\boxed{}."
    earlier = [Prompt(f"gsm8k/{i}", "gsm8k", [f"Problem {i}: Ann has {i} apples and eats one. How many are" + suffix])
               for i in range(12)]  # fmt: skip
    items = [
        Prompt("new", "gsm8k", ["Bob buys 7 pears and gives 2 away. How many pears are" + suffix]),
        Prompt("copy", "gsm8k", earlier[3].turns),
    ]
    assert [p.id for p in D.decontaminate(items, earlier)] == ["new"]
    assert [p.id for p in D.decontaminate(items, earlier[:9])] == []  # under 10 sharing prompts, still a match


def test_interleave_keeps_the_mix_in_every_prefix():
    groups = [_prompts(60, "a"), _prompts(25, "b"), _prompts(15, "c")]
    merged = D.interleave(groups, [0.6, 0.25, 0.15])
    assert len(merged) == 100
    for n in (10, 20, 40, 100):
        counts = {d: sum(p.dataset == d for p in merged[:n]) for d in "abc"}
        assert (
            abs(counts["a"] - 0.6 * n) <= 1 and abs(counts["b"] - 0.25 * n) <= 1 and abs(counts["c"] - 0.15 * n) <= 1
        )
    assert [p.id for p in merged if p.dataset == "a"] == [p.id for p in groups[0]]  # order within a group kept


def test_build_prompt_mix(tokenizer):
    shared = Prompt("s-dup", "src", ["w1 w2 w3"])
    sources = {
        "gsm8k": _prompts(40, "g") + [Prompt("long", "g", [" ".join(WORDS)])],
        "sharegpt": _prompts(30, "s") + [shared],
        "code": [Prompt("c-dup", "code", ["w1  W2 w3"]), *_prompts(30, "c")[1:]],
    }
    weights = {"gsm8k": 0.6, "sharegpt": 0.25, "code": 0.15}
    kwargs = dict(n_eval={"gsm8k": 4, "sharegpt": 2}, max_prompt_tokens=20, seed=3)
    train, evals = D.build_prompt_mix(sources, weights, 20, tokenizer, **kwargs)
    again, evals_again = D.build_prompt_mix(sources, weights, 20, tokenizer, **kwargs)
    assert [p.id for p in train] == [p.id for p in again] and [p.id for p in evals] == [p.id for p in evals_again]
    assert [sum(p.dataset == n for p in train) for n in weights] == [12, 5, 3]
    assert [sum(p.dataset == n for p in evals) for n in weights] == [4, 2, 0]
    assert {p.dataset for p in evals[:3]} == {"gsm8k", "sharegpt"}  # interleaved: a prefix samples every source
    keys = [D.normalise(p.turns[0]) for p in train + evals]
    assert len(keys) == len(set(keys))  # no text in two places, in particular not in train and eval
    assert all(p.id.startswith(f"{p.dataset}:") for p in train + evals)
    assert "gsm8k:long" not in {p.id for p in train + evals}  # over max_prompt_tokens
    assert train[0].dataset == "gsm8k" and {p.dataset for p in train[:5]} == {"gsm8k", "sharegpt", "code"}
    with pytest.raises(ValueError, match="unknown sources"):
        D.build_prompt_mix(sources, {"mt-bench": 1.0}, 5, tokenizer)


def test_build_prompt_mix_says_when_a_source_runs_out(tokenizer):
    sources = {"gsm8k": _prompts(40, "g"), "code": _prompts(3, "c")}
    with pytest.warns(UserWarning, match="'code' ran out: 3 of 10"):
        train, _ = D.build_prompt_mix(sources, {"gsm8k": 0.5, "code": 0.5}, 20, tokenizer, seed=1)
    assert [sum(p.dataset == n for p in train) for n in sources] == [10, 3]
    with pytest.raises(ValueError, match="No training prompt left.*--max-prompt-tokens"):
        D.build_prompt_mix(sources, {"gsm8k": 1.0, "code": 1.0}, 20, tokenizer, max_prompt_tokens=1)
    with pytest.raises(ValueError, match="No training prompt left"):
        D.build_prompt_mix(sources, {"gsm8k": 1.0}, 5, tokenizer, exclude=sources["gsm8k"])


def test_batched_left_padding_matches_unbatched_generate(tokenizer, target, tmp_path):
    prompts = _prompts(7)
    eos_ids = [tokenizer.eos_token_id]
    refs = {p.id: _reference(target, tokenizer, p, 12, eos_ids) for p in prompts}
    # Make some prompts stop early and others not: declare a token only some responses emit an extra eos.
    stopper = next(t for r in refs.values() for t in r[1:] if any(t not in other for other in refs.values()))
    target.generation_config.eos_token_id = [tokenizer.eos_token_id, stopper]
    eos_ids = target.generation_config.eos_token_id
    refs = {p.id: _reference(target, tokenizer, p, 12, eos_ids) for p in prompts}
    try:
        out = D.regenerate_responses(target, tokenizer, prompts, tmp_path / "r.jsonl", batch_size=3, max_new_tokens=12)
    finally:
        target.generation_config.eos_token_id = tokenizer.eos_token_id
    rows = D.read_responses(out)
    assert sorted(r["id"] for r in rows) == sorted(refs)
    assert any(r["finished"] for r in rows) and any(not r["finished"] for r in rows)
    for row in rows:
        assert row["response_ids"] == refs[row["id"]]
        assert row["finished"] == (row["response_ids"][-1] in eos_ids)
        assert row["finished"] or len(row["response_ids"]) == 12
        assert row["prompt_ids"] == tokenizer(row["prompt_text"], add_special_tokens=False).input_ids
        assert row["prompt_text"].endswith("<|im_start|> assistant ") and row["source"] == "src"


def test_length_sorting_stays_within_windows(tokenizer, target, tmp_path, monkeypatch):
    prompts = _prompts(12)
    batches = []
    generate = target.generate

    def spy(**kwargs):
        batches.append(kwargs["input_ids"].shape)
        return generate(**kwargs)

    monkeypatch.setattr(target, "generate", spy)
    path = D.regenerate_responses(
        target, tokenizer, prompts, tmp_path / "r.jsonl", batch_size=2, max_new_tokens=2, sort_window=3
    )
    order = [r["id"] for r in D.read_responses(path)]
    assert sorted(order[:6]) == sorted(p.id for p in prompts[:6])  # first window written first
    assert [b[1] for b in batches[:3]] == sorted(b[1] for b in batches[:3])  # sorted inside the window


def test_resume_skips_done_ids_and_repairs_a_cut_line(tokenizer, target, tmp_path, monkeypatch):
    prompts = _prompts(6)
    path = tmp_path / "r.jsonl"
    D.regenerate_responses(target, tokenizer, prompts[:4], path, batch_size=2, max_new_tokens=4)
    first = D.read_responses(path)
    with path.open("a") as handle:
        handle.write('{"id": "src-5", "source": "src", "prompt_te')  # a run killed mid-write
    assert len(D.read_responses(path)) == 4
    calls = []
    generate = target.generate
    monkeypatch.setattr(target, "generate", lambda **kw: calls.append(kw["input_ids"].shape[0]) or generate(**kw))
    D.regenerate_responses(target, tokenizer, prompts, path, batch_size=2, max_new_tokens=4)
    rows = D.read_responses(path)
    assert calls == [2]  # only src-4 and src-5
    assert rows[:4] == first and sorted(r["id"] for r in rows[4:]) == ["src-4", "src-5"]
    assert all(line.startswith("{") for line in path.read_text().splitlines())
    monkeypatch.setattr(target, "generate", generate)
    straight = D.regenerate_responses(target, tokenizer, prompts, tmp_path / "s.jsonl", batch_size=2, max_new_tokens=4)
    by_id = {r["id"]: r for r in D.read_responses(straight)}
    assert {r["id"]: r for r in rows} == by_id  # the killed and resumed run wrote what an uninterrupted one writes
    with pytest.raises(ValueError, match="unique"):
        D.regenerate_responses(target, tokenizer, prompts + prompts[:1], path)


class _FakeServer(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
        if "w0" in body["prompt"]:
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        stop = "w1" in body["prompt"]
        reply = {"choices": [{"text": "w5 w6" if stop else "w7 w8 w9", "finish_reason": "stop" if stop else "length"}]}
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(reply).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _FakeServer.requests = []
    httpd = HTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/v1"
    httpd.shutdown()


def test_openai_server_regeneration(tokenizer, server, tmp_path):
    prompts = [Prompt("a", "s", ["w1 w2"]), Prompt("b", "s", ["w3"])]
    path = D.regenerate_responses_openai(
        server, "tiny", tokenizer, prompts, tmp_path / "r.jsonl", max_new_tokens=3, api_key="k"
    )
    rows = {r["id"]: r for r in D.read_responses(path)}
    ids = tokenizer.convert_tokens_to_ids
    assert rows["a"]["response_ids"] == ids(["w5", "w6", "<|im_end|>"]) and rows["a"]["finished"]
    assert rows["b"]["response_ids"] == ids(["w7", "w8", "w9"]) and not rows["b"]["finished"]
    assert rows["a"]["prompt_ids"] == tokenizer(D.chat_text(tokenizer, prompts[0]), add_special_tokens=False).input_ids
    sent = _FakeServer.requests[0]
    assert sent["path"] == "/v1/completions" and sent["auth"] == "Bearer k"
    assert sent["max_tokens"] == 3 and sent["temperature"] == 0.0 and sent["model"] == "tiny"
    assert {r["prompt"] for r in _FakeServer.requests} == {D.chat_text(tokenizer, p) for p in prompts}
    D.regenerate_responses_openai(server, "tiny", tokenizer, prompts, path)
    assert len(_FakeServer.requests) == 2  # resumed: nothing left to ask
    with pytest.raises(RuntimeError, match="HTTP 500: boom"):
        D.regenerate_responses_openai(server, "tiny", tokenizer, [Prompt("c", "s", ["w0"])], path)


def test_sampling_is_seeded(tokenizer, target, tmp_path):
    prompts = _prompts(4)
    kwargs = dict(batch_size=2, max_new_tokens=8, do_sample=True, temperature=1.5)
    a = D.read_responses(D.regenerate_responses(target, tokenizer, prompts, tmp_path / "a.jsonl", seed=1, **kwargs))
    b = D.read_responses(D.regenerate_responses(target, tokenizer, prompts, tmp_path / "b.jsonl", seed=1, **kwargs))
    greedy = D.read_responses(
        D.regenerate_responses(target, tokenizer, prompts, tmp_path / "g.jsonl", max_new_tokens=8)
    )
    assert a == b
    assert [r["response_ids"] for r in a] != [r["response_ids"] for r in greedy]


def test_the_regenerated_data_in_git_reads_as_response_rows(tmp_path) -> None:
    files = sorted((Path(__file__).resolve().parents[1] / "data").glob("*.jsonl.xz"))
    assert files, "data/ holds the regenerated responses (data/README.md)"
    seen: set[str] = set()
    for file in files:
        plain = tmp_path / file.stem  # the .jsonl
        plain.write_bytes(lzma.decompress(file.read_bytes()))
        rows = D.read_responses(plain)
        ids = {row["id"] for row in rows}
        assert rows and len(ids) == len(rows), file.name
        assert all(row["response_ids"] and row["source"] for row in rows), file.name
        assert sequences_from_responses(rows, block_size=16, max_seq_len=448), file.name
        assert not ids & seen, f"{file.name} repeats prompts of an earlier file: each continues the draw"
        seen |= ids


def test_second_turns_are_answered_after_the_targets_own_first_answer(tokenizer, target, tmp_path):
    firsts = _prompts(4)
    first_rows = tmp_path / "first.jsonl"
    D.regenerate_responses(target, tokenizer, firsts[:3], first_rows, batch_size=2, max_new_tokens=5)
    packed = tmp_path / "first.jsonl.xz"  # data/ keeps responses xz-compressed; --first-answers reads them so
    packed.write_bytes(lzma.compress(first_rows.read_bytes()))
    answer = {r["id"]: tokenizer.decode(r["response_ids"], skip_special_tokens=True) for r in D.read_responses(packed)}
    two_turns = [Prompt(f"c{i}-t2", "chat", [p.turns[0], f"w3{i} w1{i}"]) for i, p in enumerate(firsts)]
    source = write_prompts([*two_turns, Prompt("single", "chat", ["w5 w6"])], tmp_path / "chat.jsonl")
    flags = ["prompts", "--work-dir", str(tmp_path / "run"), "--num-prompts", "4", "--num-eval", "0"]
    only_two = write_prompts(two_turns, tmp_path / "two.jsonl")
    with pytest.raises(ValueError, match="none of its 4 multi-turn prompts .* Pass --first-answers RESPONSES"):
        stage_prompts(build_parser().parse_args([*flags, "--source", f"jsonl:{only_two}"]), target, tokenizer)
    flags += ["--source", f"jsonl:{source}", "--first-answers", str(packed)]
    stage_prompts(build_parser().parse_args(flags), target, tokenizer)
    drawn = {p.id.split(":")[-1]: p for p in load_prompts(f"jsonl:{tmp_path / 'run' / 'prompts.train.jsonl'}")}
    assert sorted(drawn) == ["c0-t2", "c1-t2", "c2-t2", "single"]  # c3's first turn has no answer: dropped
    for i in range(3):
        assert drawn[f"c{i}-t2"].answers == [answer[f"src-{i}"]]
    assert drawn["single"].answers == []

    out = D.regenerate_responses(target, tokenizer, list(drawn.values()), tmp_path / "r.jsonl", max_new_tokens=5)
    rows = {r["id"].split(":")[-1]: r for r in D.read_responses(out)}
    eos_ids = [tokenizer.eos_token_id]
    for i, p in enumerate(firsts[:3]):
        messages = [{"role": "user", "content": p.turns[0]}, {"role": "assistant", "content": answer[f"src-{i}"]}]
        messages.append({"role": "user", "content": f"w3{i} w1{i}"})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rows[f"c{i}-t2"]["prompt_text"] == text and answer[f"src-{i}"] in text
        assert rows[f"c{i}-t2"]["response_ids"] == _reference(target, tokenizer, drawn[f"c{i}-t2"], 5, eos_ids)


def test_magpie_prompts_are_the_targets_own_complete_user_turns_seeded(tokenizer, target):
    prompts = magpie_prompts(target, tokenizer, 6, max_prompt_tokens=64, batch_size=8, seed=3)
    texts = [p.turns[0] for p in prompts]
    assert [p.id for p in prompts] == [f"magpie-3-{k}" for k in range(6)]
    assert {p.dataset for p in prompts} == {"magpie"} and all(len(p.turns) == 1 for p in prompts)
    assert all(texts) and len({D.normalise(t) for t in texts}) == 6  # none empty, none repeated
    assert all(set(t.split()) <= {*WORDS, "user", "assistant"} for t in texts)  # no special token leaks in
    assert all(len(tokenizer(D.chat_text(tokenizer, p)).input_ids) <= 64 for p in prompts)
    assert magpie_prompts(target, tokenizer, 6, max_prompt_tokens=64, batch_size=8, seed=3) == prompts
    assert magpie_prompts(target, tokenizer, 6, max_prompt_tokens=64, batch_size=8, seed=4) != prompts


def test_magpie_drops_turns_still_open_at_the_cap_and_says_so(tokenizer, target):
    frame = len(tokenizer(D.chat_text(tokenizer, Prompt("x", "x", [""]))).input_ids)
    with pytest.warns(UserWarning, match=r"magpie: \d+ of 50 prompts .* raise --max-prompt-tokens"):
        prompts = magpie_prompts(target, tokenizer, 50, max_prompt_tokens=frame + 2, batch_size=8)
    assert len(prompts) < 50 and all(1 <= len(p.turns[0].split()) <= 2 for p in prompts)


def test_magpie_needs_a_chat_template(tokenizer, target):
    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, unk_token="<unk>")
    with pytest.raises(ValueError, match="needs the target's chat template"):
        magpie_prompts(target, plain, 4)


def test_prompts_stage_draws_magpie_prompts_for_the_mix(tokenizer, target, tmp_path):
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    work = tmp_path / "run"
    main(["prompts", "--target", str(tmp_path / "target"), "--work-dir", str(work), "--source", "magpie",
          "--num-prompts", "5", "--num-eval", "1", "--max-prompt-tokens", "64", "--gen-batch-size", "8"])  # fmt: skip
    train = [json.loads(line) for line in (work / "prompts.train.jsonl").open()]
    held_out = [json.loads(line) for line in (work / "prompts.eval.jsonl").open()]
    assert len(train) == 5 and len(held_out) == 1
    assert {row["dataset"] for row in train + held_out} == {"magpie"}
    assert all(row["messages"][0]["role"] == "user" and row["messages"][0]["content"] for row in train)
