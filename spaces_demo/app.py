"""DFlash on a Hugging Face Space: plain decoding and DFlash side by side, streamed, on the CPU.

Only the layout lives here; the logic (model allowlist, bounds, the two runs, the coloured tokens, the histogram,
the identical-output check) is `transformers_dflash.demo`. Run locally with `make space` (honours
`GRADIO_SERVER_PORT`); extra model pairs come from `$DFLASH_DEMO_PAIRS` (see the demo module).
"""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from transformers_dflash import demo

INTRO = """# DFlash: block-diffusion speculative decoding
A small drafter proposes a whole block of tokens in one forward pass; the target model checks the block in one
forward pass and keeps the longest correct prefix plus one token of its own. Under greedy decoding the output is
exactly the target's own. Both runs below use the same CPU, one after the other."""


def build(pairs: dict[str, demo.PairSpec] | None = None) -> gr.Blocks:
    """The demo's Blocks for the allowlisted `pairs` (default: `demo.allowed_pairs()`)."""
    pairs = demo.allowed_pairs() if pairs is None else pairs
    cache, limits, first = demo.PairCache(pairs), demo.LIMITS, demo.default_pair(pairs)

    def pair_settings(name: str) -> tuple[str, dict]:
        size = demo.drafter_block_size(pairs[name])
        return demo.pair_note(pairs, name), gr.update(maximum=size, value=size)

    def run(name: str, prompt: str, max_new_tokens: float, block_size: float, temperature: float) -> Iterator[tuple]:
        settings = demo.Settings(int(max_new_tokens), int(block_size), float(temperature))
        for view in demo.stream_comparison(cache, name, prompt, settings, limits):
            yield (
                view.status, view.plain_speed, view.plain_html, view.dflash_speed, view.dflash_html,
                view.summary, view.identical, view.histogram,
            )  # fmt: skip

    with gr.Blocks(title="DFlash speculative decoding") as app:
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(
                    label="Prompt", lines=5, max_length=limits.max_prompt_chars, elem_id="prompt",
                    placeholder="Ask something, or pick an example below",
                )  # fmt: skip
                examples = demo.example_prompts(limits)
                if examples:
                    gr.Examples(
                        [[text] for _, text in examples], inputs=[prompt], example_labels=[k for k, _ in examples]
                    )
            with gr.Column(scale=2):
                pair = gr.Dropdown(list(pairs), value=first, label="Model pair (target + drafter)", elem_id="pair")
                note = gr.Markdown(demo.pair_note(pairs, first), elem_id="pair-note")
                max_new = gr.Slider(
                    1, limits.max_new_tokens, value=128, step=1, label="Max new tokens", elem_id="max-new"
                )
                size = demo.drafter_block_size(pairs[first])
                block = gr.Slider(2, size, value=size, step=1, label="Block size (tokens per draft)")
                temperature = gr.Slider(
                    0.0, limits.max_temperature, value=0.0, step=0.05, label="Temperature (0 = greedy)"
                )
                button = gr.Button("Run", variant="primary", elem_id="run")
        status = gr.Markdown(elem_id="status")
        with gr.Row():
            with gr.Column():
                gr.Markdown("### Plain decoding (the target alone)")
                plain_speed = gr.Markdown(elem_id="plain-speed")
                plain = gr.HTML(demo.pane_html([]), elem_id="plain-pane")
            with gr.Column():
                gr.Markdown("### DFlash (drafter + target)")
                dflash_speed = gr.Markdown(elem_id="dflash-speed")
                dflash = gr.HTML(demo.pane_html([]), elem_id="dflash-pane")
                gr.HTML(demo.legend_html())
        with gr.Row():
            with gr.Column():
                summary = gr.Markdown(elem_id="summary")
                identical = gr.Markdown(elem_id="identical")
            histogram = gr.Plot(show_label=False, elem_id="histogram")
        pair.change(pair_settings, pair, [note, block])
        outputs = [status, plain_speed, plain, dflash_speed, dflash, summary, identical, histogram]
        button.click(run, [pair, prompt, max_new, block, temperature], outputs)
    return app


if __name__ == "__main__":
    build().queue(default_concurrency_limit=1, max_size=20).launch(css=demo.PANE_CSS)
