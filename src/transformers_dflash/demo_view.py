"""What the demo shows: each token's text, the panes' HTML (DFlash tokens coloured by step), the histogram figure.

Pure functions of token ids and statistics, used by `demo.stream_comparison`; no Gradio here.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from matplotlib.figure import Figure
from transformers import PreTrainedTokenizerBase

from .stats import DFlashStats

# Okabe & Ito (2008), the colour-blind-safe qualitative palette, in an order where neighbours differ in lightness.
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")


class TokenTexts:
    """The text of each generated token, as a decode of the whole sequence shows it.

    Each token's piece is what it adds to the decoded text (a few prompt tokens of left context included, so that
    leading spaces come out right). A character whose bytes span several tokens (byte-level BPE) goes to the token
    that completes it; the tokens before it get "" rather than a U+FFFD replacement character each.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], context: int = 4) -> None:
        self.tokenizer = tokenizer
        self.ids, self.pieces = list(prompt_ids[-context:]), []
        self._text = self._complete_text()

    def _complete_text(self) -> str:
        """The decoded text less a trailing partial character (bytes that later tokens complete)."""
        return self.tokenizer.decode(self.ids).rstrip("\ufffd")

    def extend(self, new_ids: list[int]) -> None:
        """Decode the pieces of `new_ids`."""
        for token in new_ids:
            self.ids.append(token)
            text = self._complete_text()
            # a decoder that rewrites earlier text (e.g. cleanup of spaces) falls back to the token alone
            self.pieces.append(
                text[len(self._text) :] if text.startswith(self._text) else self.tokenizer.decode([token])
            )
            self._text = text


@dataclass
class Pane:
    """One side's progress: its tokens, their pieces of text, the tokens committed by each step, its speed."""

    texts: TokenTexts
    steps: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second so far."""
        return len(self.texts.pieces) / self.seconds if self.seconds > 0 else 0.0

    def speed(self, done: bool) -> str:
        """Markdown speed line."""
        state = "done" if done else "running…"
        n = len(self.texts.pieces)
        return f"**{self.tokens_per_second:.1f} tokens/s** · {n} tokens · {self.seconds:.2f} s · {state}"


def pane_html(pieces: list[str]) -> str:
    """The plain pane: the text, escaped, whitespace kept."""
    return f'<div class="dflash-pane">{html.escape("".join(pieces))}</div>'


def blocks_html(pieces: list[str], steps: list[int]) -> str:
    """The DFlash pane: each step's tokens in its own colour, its accepted drafts tinted, its last token (the
    target's own, the bonus) in the full colour with an outline; hover titles say which is which.

    `steps[0]` is the prefill's single token; each later entry is one step's committed count (drafts + bonus).
    """
    spans, start = [], 0
    for step, count in enumerate(steps):
        colour = OKABE_ITO[step % len(OKABE_ITO)]
        for k, piece in enumerate(pieces[start : start + count]):
            bonus = k == count - 1
            if step == 0:
                title = "prefill: the target's first token"
            elif bonus:
                title = f"step {step}: the target's own token, after {count - 1} accepted draft token(s)"
            else:
                title = f"step {step}: draft token {k + 1} of {count - 1}, accepted by the target"
            kind = "bonus" if bonus else "draft"
            spans.append(
                f'<span class="tok {kind}" style="--c:{colour}" title="{html.escape(title)}">{html.escape(piece)}</span>'
            )
        start += count
    return f'<div class="dflash-pane">{"".join(spans)}</div>'


def legend_html() -> str:
    """Legend of the DFlash pane's colours."""
    draft = f'<span class="tok draft" style="--c:{OKABE_ITO[1]}">accepted draft</span>'
    bonus = f'<span class="tok bonus" style="--c:{OKABE_ITO[1]}">target token</span>'
    return (
        f'<div class="dflash-legend">{draft} tokens drafted by DFlash and accepted · {bonus} the token the target '
        "adds after them (one per step) · each step has its own colour; hover a token for details</div>"
    )


PANE_CSS = """
.dflash-pane { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.9em; line-height: 1.7;
  min-height: 12em; max-height: 28em; overflow-y: auto; padding: 0.6em; border: 1px solid #ccc; border-radius: 6px; }
.tok { color: inherit; border-radius: 2px; }
.tok.draft { background: color-mix(in srgb, var(--c) 30%, transparent); }
.tok.bonus { background: color-mix(in srgb, var(--c) 70%, transparent); font-weight: 700; outline: 1.5px solid currentColor;
  outline-offset: -1.5px; }
.dflash-legend { font-size: 0.85em; line-height: 2; }
"""


def acceptance_figure(stats: DFlashStats) -> Figure:
    """Bar chart of tokens committed per step (accepted drafts + the target's token), with tau."""
    counts = stats.histogram
    figure = Figure(figsize=(6, 2.8), layout="constrained")
    axes = figure.subplots()
    lengths = list(range(1, len(counts)))
    axes.bar(lengths, counts[1:], color=OKABE_ITO[4])
    axes.set_ylim(0, max(counts) * 1.2 + 1)
    axes.set_title(f"Acceptance lengths over {stats.steps} steps", fontsize=10)
    axes.axvline(stats.tau, color=OKABE_ITO[5], linestyle="--", label=f"τ = {stats.tau:.2f}")
    axes.set_xticks(lengths)
    axes.set_xlabel("tokens committed in one step (accepted drafts + 1)")
    axes.set_ylabel("steps")
    axes.legend(loc="upper right")
    return figure


@dataclass
class DemoView:
    """Everything the app shows, as one snapshot (Markdown, HTML and a figure)."""

    status: str = ""
    plain_html: str = pane_html([])
    plain_speed: str = ""
    dflash_html: str = pane_html([])
    dflash_speed: str = ""
    summary: str = ""
    identical: str = ""
    histogram: Figure | None = None


def identity_check(plain_ids: list[int], dflash_ids: list[int], temperature: float) -> str:
    """Markdown verdict comparing the two panes' token ids (meaningful under greedy decoding)."""
    if temperature > 0:
        return (
            f"ℹ️ Sampling (temperature {temperature:g}): each pane is an independent sample of the target's "
            "distribution, so the texts differ. Set temperature 0 to check that the outputs are identical."
        )
    if plain_ids == dflash_ids:
        return f"✔ **Identical output**: both panes hold the same {len(plain_ids)} token ids."
    same = [a == b for a, b in zip(plain_ids, dflash_ids, strict=False)]
    first = same.index(False) if False in same else len(same)
    return f"✘ **Outputs differ** from token {first} on ({len(plain_ids)} vs {len(dflash_ids)} tokens)."


def show(view: DemoView, side: str, pane: Pane, done: bool) -> None:
    """Put `pane` (side "plain" or "dflash") into `view`."""
    if side == "plain":
        view.plain_html, view.plain_speed = pane_html(pane.texts.pieces), pane.speed(done)
    else:
        view.dflash_html, view.dflash_speed = blocks_html(pane.texts.pieces, pane.steps), pane.speed(done)
