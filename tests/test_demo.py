"""The demo's logic (`transformers_dflash.demo`) on a tiny random pair registered through `$DFLASH_DEMO_PAIRS`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, save_tiny_pair
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from transformers_dflash import demo, demo_view


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, demo.PairSpec]:
    config = save_tiny_pair(tmp_path_factory.mktemp("tiny_pair"))
    return demo.allowed_pairs({demo.PAIRS_ENV: json.dumps(config)})


@pytest.fixture(scope="module")
def cache(tiny_pairs: dict[str, demo.PairSpec]) -> demo.PairCache:
    return demo.PairCache(tiny_pairs)


def run(cache: demo.PairCache, prompt: str = "Hello there", **settings: float) -> list[demo.DemoView]:
    values = {"max_new_tokens": 24, "block_size": 4, "temperature": 0.0} | settings
    return list(demo.stream_comparison(cache, TINY, prompt, demo.Settings(**values), refresh_s=0.0))


def test_allowlist_embedded_first_then_configured(tiny_pairs: dict[str, demo.PairSpec]) -> None:
    assert list(tiny_pairs) == [demo.EMBEDDED_PAIR, TINY]
    assert tiny_pairs[demo.EMBEDDED_PAIR].target_dir is None
    assert demo.drafter_block_size(tiny_pairs[TINY]) == 4
    assert list(demo.allowed_pairs({})) == [demo.EMBEDDED_PAIR]


@pytest.mark.parametrize(
    "value, message",
    [
        ("{not json", "not valid JSON"),
        ('["a"]', "must be a JSON object"),
        ('{"x": {"target": "/nonexistent"}}', '"drafter": dir'),
        ('{"x": {"target": "/nonexistent", "drafter": "/nonexistent"}}', "has no config.json"),
    ],
)
def test_allowlist_rejects_bad_configuration(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        demo.allowed_pairs({demo.PAIRS_ENV: value})


def test_missing_embedded_drafter_is_explained(
    tiny_pairs: dict[str, demo.PairSpec], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLASH_EMBEDDED_DRAFTER", str(tmp_path / "absent"))
    assert "not available" in demo.pair_problem(tiny_pairs[demo.EMBEDDED_PAIR])
    assert demo.default_pair(tiny_pairs) == TINY
    assert "Showing **" + TINY in demo.pair_note(tiny_pairs, TINY)
    assert demo.pair_note(tiny_pairs, demo.EMBEDDED_PAIR).startswith("⚠️")
    cache = demo.PairCache(tiny_pairs)
    final = list(demo.stream_comparison(cache, demo.EMBEDDED_PAIR, "hi", demo.Settings(4, 4, 0.0)))[-1]
    assert "No DFlash drafter checkpoint" in final.status and "still running" in final.status


def test_greedy_comparison_streams_both_panes_then_results(cache: demo.PairCache) -> None:
    views = run(cache)
    final = views[-1]
    assert final.status == "Done.", final.status
    assert any("running" in v.plain_speed for v in views) and any("running" in v.dflash_speed for v in views)
    assert "tokens/s" in final.plain_speed and "tokens/s" in final.dflash_speed and "done" in final.dflash_speed
    assert "Speed-up ×" in final.summary and "τ = " in final.summary
    assert "Identical output" in final.identical and "24 token ids" in final.identical
    assert final.histogram is not None and final.histogram.axes[0].get_xlabel()
    assert 'class="tok bonus"' in final.dflash_html and "prefill" in final.dflash_html
    assert all(v.dflash_html == demo.pane_html([]) for v in views if v.status.startswith("Running plain"))


def test_panes_hold_the_same_text_under_greedy(cache: demo.PairCache) -> None:
    final = run(cache, max_new_tokens=16)[-1]
    plain_text = final.plain_html.removeprefix('<div class="dflash-pane">').removesuffix("</div>")
    spans = final.dflash_html.split("</span>")[:-1]
    assert "".join(span.rsplit(">", 1)[1] for span in spans) == plain_text != ""


def test_sampling_explains_instead_of_checking(cache: demo.PairCache) -> None:
    final = run(cache, temperature=0.8)[-1]
    assert final.status == "Done." and "Sampling" in final.identical


@pytest.mark.parametrize(
    "prompt, settings, message",
    [
        ("   ", {}, "Type a prompt"),
        ("x" * (demo.LIMITS.max_prompt_chars + 1), {}, "characters; the limit"),
        ("hi", {"max_new_tokens": demo.LIMITS.max_new_tokens + 1}, "Max new tokens"),
        ("hi", {"block_size": 5}, "Block size must be between 2 and 4"),
        ("hi", {"temperature": -1.0}, "Temperature"),
    ],
)
def test_bad_requests_become_messages(cache: demo.PairCache, prompt: str, settings: dict, message: str) -> None:
    final = run(cache, prompt, **settings)[-1]
    assert final.status.startswith("⚠️") and message in final.status


def test_failures_become_messages_and_the_cache_keeps_serving(
    cache: demo.PairCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        "Unknown model pair" in list(demo.stream_comparison(cache, "/etc", "hi", demo.Settings(4, 4, 0.0)))[-1].status
    )

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(demo, "dflash_generate", broken)
    final = run(cache)[-1]
    assert "RuntimeError: engine exploded" in final.status and "still running" in final.status
    monkeypatch.undo()
    assert run(cache)[-1].status == "Done."


def test_blocks_html_tells_drafts_from_bonus_tokens() -> None:
    page = demo.blocks_html(["A", "b", "c", "<&>"], [1, 3])
    assert page.count('class="tok draft"') == 2 and page.count('class="tok bonus"') == 2
    assert "draft token 2 of 2, accepted" in page and "after 2 accepted draft token(s)" in page
    assert "&lt;&amp;&gt;" in page and demo.OKABE_ITO[1] in page
    assert "accepted draft" in demo.legend_html() and "target token" in demo.legend_html()


def test_streamed_call_cancels_at_the_next_step_and_reraises_errors() -> None:
    calls = []

    def steps(streamer: demo.StepStreamer) -> str:
        streamer.put(torch.tensor([[9, 9]]))  # the prompt, not a step
        for i in range(100):
            calls.append(i)
            streamer.put(torch.tensor([i]))
            time.sleep(0.01)
        return "done"

    stream = demo.StreamedCall(steps)
    iterator = iter(stream)
    assert next(iterator) == [0]
    stream.cancel()
    iterator.close()
    time.sleep(0.1)
    assert len(calls) < 20

    def failing(streamer: demo.StepStreamer) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        list(demo.StreamedCall(failing))


def test_examples_cover_math_code_and_chat(monkeypatch: pytest.MonkeyPatch) -> None:
    examples = demo.example_prompts(per_kind=1)
    assert [label.split(":")[0] for label, _ in examples] == ["math", "code", "chat"]
    assert examples[1][0].startswith("code: def ")  # HumanEval's signature, not its template's first line

    def missing(*args: object, **kwargs: object) -> None:
        raise ModuleNotFoundError("not installed")

    monkeypatch.setattr(demo, "load_prompts", missing)
    fallback = demo.example_prompts(per_kind=1)
    assert [label.split(":")[0] for label, _ in fallback] == ["math", "code", "chat"]
    assert {text for _, text in fallback} <= {text for _, text in demo.SHOWCASE_PROMPTS}


def test_token_texts_give_a_split_character_to_the_token_that_completes_it() -> None:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one token per byte: "√" takes three
    byte_level = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=byte_level)
    prompt, answer = tokenizer.encode("Area ="), tokenizer.encode(" √(a² + 1)")
    texts = demo_view.TokenTexts(tokenizer, prompt)
    texts.extend(answer[:3])
    texts.extend(answer[3:])
    assert len(texts.pieces) == len(answer) and "".join(texts.pieces) == " √(a² + 1)"
    assert texts.pieces[1:4] == ["", "", "√"] and not any("\ufffd" in piece for piece in texts.pieces)
