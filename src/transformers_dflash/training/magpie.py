"""Prompts the target writes itself (Magpie, Xu et al. 2024, arXiv 2406.08464), for a drafter without a data set.

An instruction-tuned model given its chat template only up to the start of a user turn (the system turn its template
adds, then the user header) continues with a user request drawn from what it was tuned on. Sampling that many times
gives chat first turns in the target's own distribution, which the ``responses`` stage then answers; no prompt file
and no download is needed. A sample counts when the model closes the user turn itself (the template's end-of-turn
token) before the length cap; empty and repeated texts are skipped.
"""

from __future__ import annotations

import warnings

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..prompts import Prompt, apply_chat
from ..special_ids import stop_token_ids_of
from .data import normalise

SOURCE = "magpie"
_SENTINEL = "\x00magpie\x00"
_MAX_DRAWS_PER_PROMPT = 4  # samples tried per prompt wanted before giving up with a warning


def pre_query(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], int]:
    """The chat template up to where a user's text starts, as ids, and the token that ends a user turn.

    Raises:
        ValueError: the tokenizer has no chat template, or its template ends a user turn with no token.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "The magpie source needs the target's chat template (the target writes a user turn after the template's "
            "user header); this tokenizer has none. Pass --tokenizer with an instruction-tuned model's tokenizer, or "
            "use a prompt file (--source jsonl:PATH)."
        )
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False)
    head, _, tail = text.partition(_SENTINEL)
    end = tokenizer(tail.strip(), add_special_tokens=False).input_ids
    if not end:
        raise ValueError(
            "The magpie source needs a token that ends a user turn, and this chat template writes none after the "
            f"user's text ({tail!r}); use a prompt file (--source jsonl:PATH) instead."
        )
    return tokenizer(head, add_special_tokens=False).input_ids, end[0]


@torch.inference_mode()
def magpie_prompts(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    count: int,
    max_prompt_tokens: int = 256,
    batch_size: int = 32,
    temperature: float = 1.0,
    seed: int = 0,
) -> list[Prompt]:
    """``count`` distinct single-turn prompts sampled from ``target`` after its template's user header.

    Args:
        target: an instruction-tuned causal LM (its device is used).
        tokenizer: its tokenizer, with a chat template.
        count: prompts wanted.
        max_prompt_tokens: longest prompt kept, rendered through the chat template (as ``--max-prompt-tokens``); a
            sample still writing the user turn at that length is dropped.
        batch_size: samples per ``generate`` call.
        temperature: sampling temperature (plain sampling, no top-k/top-p, as Magpie).
        seed: torch seed of the sampling; the ids name it (``magpie-<seed>-<n>``).

    Returns:
        Up to ``count`` prompts of dataset ``"magpie"``, in the order drawn; fewer (with a warning) when
        ``4 * count`` samples did not give that many complete, distinct ones.
    """
    head, end_of_turn = pre_query(tokenizer)
    frame = len(
        tokenizer(apply_chat(tokenizer, [{"role": "user", "content": ""}]), add_special_tokens=False).input_ids
    )
    max_tokens = max_prompt_tokens - frame  # the user text's share of the rendered prompt
    if max_tokens < 1:
        raise ValueError(
            f"--max-prompt-tokens {max_prompt_tokens} leaves no room for a user turn ({frame} template tokens)."
        )
    stop_ids = [end_of_turn, *(t for t in stop_token_ids_of(target, None) if t != end_of_turn)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_turn
    input_ids = torch.tensor([head], device=target.device)  # [1, H]
    torch.manual_seed(seed)
    prompts: list[Prompt] = []
    seen: set[str] = set()
    draws = 0
    with tqdm(total=count, desc="magpie prompts", unit="prompt") as bar:
        while len(prompts) < count and draws < _MAX_DRAWS_PER_PROMPT * count:
            out = target.generate(
                input_ids=input_ids.expand(batch_size, -1),  # [B, H]: every row the same header
                attention_mask=torch.ones(batch_size, len(head), dtype=torch.long, device=target.device),
                max_new_tokens=max_tokens,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                eos_token_id=stop_ids,
                pad_token_id=pad_id,
            )  # [B, H + T]
            draws += batch_size
            for new in out[:, len(head) :].tolist():
                stop = next((i for i, t in enumerate(new) if t in stop_ids), None)
                if stop is None or new[stop] != end_of_turn:
                    continue  # still writing at the cap, or ended the text instead of the turn
                text = tokenizer.decode(new[:stop], skip_special_tokens=True).strip()
                key = normalise(text)
                if key and key not in seen and len(prompts) < count:
                    seen.add(key)
                    prompts.append(Prompt(f"{SOURCE}-{seed}-{len(prompts)}", SOURCE, [text]))
                    bar.update(1)
    if len(prompts) < count:
        warnings.warn(
            f"magpie: {len(prompts)} of {count} prompts from {draws} samples (the rest ran past {max_tokens} tokens, "
            "were empty or repeated); raise --max-prompt-tokens or add another --source.",
            stacklevel=2,
        )
    return prompts
