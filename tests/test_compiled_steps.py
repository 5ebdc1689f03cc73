"""The engine's steps compile whole (`fullgraph=True`): a graph break in the draft or verify step, at any verify
width in use (the block, `verify_length="auto"`'s widths, AR's one token), fails here on the CPU."""

import pytest
import torch
from conftest import greedy_reference, make_drafter, make_target, random_prompt

from transformers_dflash.adaptive import candidate_widths
from transformers_dflash.ar import ar_generate
from transformers_dflash.compiled_steps import compile_options
from transformers_dflash.engine import DFlashEngine

# "eager" runs Dynamo's capture (where graph breaks happen) without inductor's codegen: ~seconds, not minutes.
EAGER = {"backend": "eager"}


def test_options_capture_whole_steps_and_use_cuda_graphs_on_cuda():
    assert compile_options(torch.device("cpu"), True) == {"dynamic": False, "fullgraph": True}
    assert compile_options(torch.device("cuda"), True)["mode"] == "reduce-overhead"
    assert compile_options(torch.device("cuda"), EAGER) == {
        "dynamic": False, "fullgraph": True, "mode": "reduce-overhead", "backend": "eager"
    }  # fmt: skip


def test_draft_and_verify_compile_without_graph_breaks():
    torch._dynamo.reset()
    target = make_target("qwen3")
    drafter = make_drafter(target, block_size=4)
    engine = DFlashEngine(target, drafter, compile=EAGER)  # fullgraph=True: any graph break raises
    breaks = torch._dynamo.utils.counters["graph_break"]
    before = sum(breaks.values())
    for verify_length, seed in ((None, 1), ("auto", 2)):  # whole blocks, then every width "auto" measures
        ids = random_prompt(seed, 7)
        out = engine.generate(ids, max_new_tokens=16, verify_length=verify_length)
        assert torch.equal(out.sequences, greedy_reference(target, ids, 16))
    # the widths that were compiled: 4 (whole blocks) and the ones "auto" measured, 1 (a plain step) included
    assert set(out.stats.verify_widths) <= set(candidate_widths(4)) == {1, 2, 4} and engine.step_costs
    ids = random_prompt(3, 5)
    assert torch.equal(
        ar_generate(target, ids, max_new_tokens=6, compile=EAGER).sequences, greedy_reference(target, ids, 6)
    )
    assert sum(breaks.values()) == before


def test_compiled_steps_are_used():
    target = make_target("llama")
    drafter = make_drafter(target, block_size=4)
    engine = DFlashEngine(target, drafter, compile=EAGER)
    calls = {"draft": 0, "verify": 0}
    draft, verify = engine._draft_step, engine._verify_step

    def counted(name, step):
        def run(*args, **kwargs):
            calls[name] += 1
            return step(*args, **kwargs)

        return run

    engine._draft_step, engine._verify_step = counted("draft", draft), counted("verify", verify)
    out = engine.generate(random_prompt(5, 6), max_new_tokens=12)
    assert calls["verify"] == out.stats.steps and calls["draft"] == out.stats.steps - 1  # step 1 drafts eagerly


def test_a_graph_break_in_a_step_fails():
    class Breaking(DFlashEngine):
        def _target_forward(self, *args, **kwargs):
            torch._dynamo.graph_break()
            return super()._target_forward(*args, **kwargs)

    target = make_target("llama")
    engine = Breaking(target, make_drafter(target, block_size=4), compile=EAGER)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        engine.generate(random_prompt(6, 5), max_new_tokens=6)
