"""Shared test support: tiny random targets (Qwen3, Llama), drafters for them, a forced-acceptance drafter, a saved
tiny pair for the demo, random response rows for the training CLI."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from transformers_dflash import DFlashConfig, DFlashDraftModel  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves the other core to parallel work

PAD, EOS, BOS, MASK = 0, 1, 2, 3
FAMILIES = ("llama", "qwen3")


def make_target(
    family: str = "llama",
    *,
    seed: int = 0,
    vocab_size: int = 96,
    hidden_size: int = 32,
    num_layers: int = 4,
    tie: bool = False,
    gqa: bool = True,
    max_positions: int = 512,
) -> PreTrainedModel:
    """A tiny random causal LM of the given family (pad 0, eos 1, bos 2; token 3 is left for the mask)."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2 if gqa else 4,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
    )
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=hidden_size // 4, **common))
    else:
        raise ValueError(family)
    with torch.no_grad():  # sharper logits than the default init, so greedy paths are not all one token
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model.eval()


def make_drafter(
    target: PreTrainedModel, *, block_size: int = 4, num_layers: int = 2, seed: int = 1, features: int | None = None
) -> DFlashDraftModel:
    """A random DFlash drafter shaped for `target`."""
    config = DFlashConfig.from_target_config(
        target.config,
        mask_token_id=MASK,
        num_hidden_layers=num_layers,
        block_size=block_size,
        num_target_features=features,
    )
    torch.manual_seed(seed)
    return DFlashDraftModel(config).eval()


class ForcedAcceptanceDrafter(DFlashDraftModel):
    """Proposes the target's own greedy tokens for a random prefix of each block, then a wrong token.

    It knows each row's reference greedy sequence (prompt + generation, unpadded) and reads the anchor's absolute
    position from `position_ids`. Its hidden state is mapped through the pseudo-inverse of the target's LM head so
    that `lm_head(h)` puts a clear maximum on the chosen token (this needs vocab <= hidden size). With
    `accept_all=True` every block is proposed fully correct.
    """

    def __init__(self, config: DFlashConfig, lm_head: torch.Tensor, seed: int = 0, accept_all: bool = False) -> None:
        super().__init__(config)
        self.register_buffer("lm_head_pinv", torch.linalg.pinv(lm_head.detach().float()), persistent=False)
        self.references: list[list[int]] = []
        self.generator = torch.Generator().manual_seed(seed)
        self.accept_all = accept_all

    def forward(self, noise_embeds: torch.Tensor, context_hidden_states=None, position_ids=None, **kwargs):
        out = super().forward(noise_embeds, context_hidden_states, position_ids, **kwargs)  # keeps cache bookkeeping
        b, q, _ = noise_embeds.shape
        vocab = self.lm_head_pinv.shape[1]
        tokens = torch.full((b, q), 4, dtype=torch.long)
        for row in range(b):
            ref = self.references[row]
            anchor = int(position_ids[row if position_ids.shape[0] > 1 else 0, -q])
            keep = q - 1 if self.accept_all else int(torch.randint(0, q, (1,), generator=self.generator))
            for k in range(1, q):
                good = ref[anchor + k] if anchor + k < len(ref) else 4
                tokens[row, k] = good if k <= keep else (good + 1) % vocab
        logits = torch.nn.functional.one_hot(tokens, vocab).float() * 20.0  # (b, q, V)
        hidden = logits @ self.lm_head_pinv.T  # (b, q, H): lm_head(hidden) == logits
        out.last_hidden_state = hidden.to(noise_embeds.dtype)
        return out


def make_forced_drafter(
    target: PreTrainedModel,
    references: list[list[int]],
    *,
    block_size: int = 4,
    seed: int = 0,
    accept_all: bool = False,
) -> ForcedAcceptanceDrafter:
    """A [`ForcedAcceptanceDrafter`] for `target` (vocab must not exceed hidden size)."""
    base = make_drafter(target, block_size=block_size)
    drafter = ForcedAcceptanceDrafter(
        base.config, target.get_output_embeddings().weight, seed=seed, accept_all=accept_all
    )
    drafter.references = [list(r) for r in references]
    return drafter.eval()


def greedy_reference(target: PreTrainedModel, input_ids: torch.LongTensor, max_new_tokens: int) -> torch.LongTensor:
    """`target.generate` greedy, the ground truth every lossless path must equal."""
    with torch.no_grad():
        return target.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new_tokens
        )


def random_prompt(seed: int, length: int, vocab_size: int = 96) -> torch.LongTensor:
    """(1, length) prompt ids avoiding pad/eos/bos/mask."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab_size, (1, length), generator=g)


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    """Each test using this runs on a Llama and on a Qwen3 target."""
    return request.param


TINY = "tiny-llama + tiny-drafter"


def save_tiny_pair(root: Path) -> dict[str, dict[str, str]]:
    """Save a tiny random Llama target (with a character tokenizer) and a drafter for it under `root`.

    Returns the `$DFLASH_DEMO_PAIRS` value that registers them as the pair `TINY`.
    """
    specials = ["<pad>", "</s>", "<s>", "<mask>"]  # ids 0-3: pad, eos, bos, mask, as conftest's tiny models use
    chars = string.ascii_letters + string.digits + " \n" + string.punctuation[:28]
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate([*specials, *chars])}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", bos_token="<s>")
    target = make_target("llama", vocab_size=len(specials) + len(chars))
    target.save_pretrained(root / "target")
    fast.save_pretrained(root / "target")
    make_drafter(target, block_size=4).save_pretrained(root / "drafter")
    return {TINY: {"target": str(root / "target"), "drafter": str(root / "drafter")}}


def write_responses(work: Path, rows: int) -> Path:
    """A new work folder with `rows` random 30-token rows (8 prompt + 22 response tokens) in responses.jsonl."""
    work.mkdir()
    with (work / "responses.jsonl").open("w") as handle:
        for i in range(rows):
            ids = random_prompt(i, 30)[0].tolist()
            handle.write(json.dumps({"id": f"r{i}", "prompt_ids": ids[:8], "response_ids": ids[8:]}) + "\n")
    return work


@pytest.fixture
def host_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at every host read of a tensor (`tolist`, `item`, `cpu`, ...) while the test runs."""
    syncs: list[int] = []
    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            syncs.append(1)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return syncs
