"""DFlashConfig: the configuration of a DFlash drafter.

One class reads every checkpoint dialect and writes the z-lab one:

* in memory (what Transformers' native DFlash path reads) the DFlash fields live at the top level:
  `block_size`, `mask_token_id`, `target_layer_ids`, `num_target_layers`;
* on disk (what the published z-lab drafters, vLLM and SGLang read) the file says `"model_type": "qwen3"`,
  keeps `block_size` and `num_target_layers` at the top level and nests `mask_token_id` / `target_layer_ids`
  in `dflash_config` (newer checkpoints may nest `block_size` there too).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig, Qwen3Config

from .checkpoint_checks import CONFIG_FILE, check_config_dict, check_path, read_config_file

# What a saved checkpoint declares, so that `AutoModel.from_pretrained(dir, trust_remote_code=True)`,
# vLLM and SGLang all find the drafter class.
ZLAB_MODEL_TYPE = "qwen3"
ZLAB_ARCHITECTURE = "DFlashDraftModel"
ZLAB_AUTO_MAP = {"AutoModel": "dflash.DFlashDraftModel"}
NESTED_KEYS = ("mask_token_id", "target_layer_ids")


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """Target layers whose hidden states condition the drafter, spread as in the DFlash paper.

    One feature takes the middle layer; otherwise `round(1 + i * (L - 4) / (n - 1))` for i in 0..n-1, i.e. from
    the second layer to the fourth-from-last (36 layers, 5 features -> [1, 9, 17, 25, 33]).
    """
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}.")
    if num_features == 1:
        return [num_target_layers // 2]
    if num_target_layers < 5:
        # Too shallow for the paper's spread; use distinct layers evenly from the first to the last.
        span = num_target_layers - 1
        return sorted({round(i * span / (num_features - 1)) for i in range(num_features)})
    return [round(1 + i * (num_target_layers - 4) / (num_features - 1)) for i in range(num_features)]


class DFlashConfig(Qwen3Config):
    r"""Configuration of a [`DFlashDraftModel`]: a few Qwen3-style decoder layers conditioned on target features.

    Args:
        block_size (`int`, defaults to 16):
            Tokens drafted per step: the last verified token followed by `block_size - 1` mask tokens.
        mask_token_id (`int`):
            A real, otherwise unused row of the target's embedding (never pad or eos) used for the masked slots.
        target_layer_ids (`list[int]`, *optional*):
            0-based target layers whose outputs (Transformers' `hidden_states[i + 1]`) are concatenated as context.
            Defaults to [`default_target_layer_ids`] with one feature per draft layer (the z-lab convention).
        num_target_layers (`int`):
            Depth of the target model the drafter was trained for.
        dflash_config (`dict`, *optional*):
            The z-lab nested dialect; its keys fill the top-level fields above when those are not given.

    All other arguments are those of [`Qwen3Config`] (hidden size, heads, rope, `layer_types`, `sliding_window`, ...).
    """

    model_type = "dflash"

    block_size: int | None = None
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = None
    num_target_layers: int | None = None
    dflash_config: dict | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        nested = dict(self.dflash_config or {})
        self.block_size = int(self.block_size if self.block_size is not None else nested.get("block_size", 16))
        if self.mask_token_id is None:
            self.mask_token_id = nested.get("mask_token_id")
        if self.target_layer_ids is None:
            self.target_layer_ids = nested.get("target_layer_ids")
        if self.num_target_layers is None and self.target_layer_ids:
            self.num_target_layers = max(self.target_layer_ids) + 1
        if self.target_layer_ids is None and self.num_target_layers is not None:
            self.target_layer_ids = default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        self.target_layer_ids = [int(i) for i in self.target_layer_ids] if self.target_layer_ids else []
        extra = {k: v for k, v in nested.items() if k not in (*NESTED_KEYS, "block_size")}
        self.dflash_config = {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids, **extra}
        super().__post_init__(**kwargs)
        self._check()

    def _check(self) -> None:
        if self.block_size < 2:
            raise ValueError(
                f"block_size must be >= 2 (one anchor plus at least one drafted token), got {self.block_size}."
            )
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"mask_token_id={self.mask_token_id} is outside the vocabulary (size {self.vocab_size}); pick an unused "
                "row of the target's embedding."
            )
        if self.num_target_layers is not None:
            bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
            if bad:
                raise ValueError(
                    f"target_layer_ids {bad} are outside the target's depth (num_target_layers={self.num_target_layers}); "
                    "layer ids are 0-based."
                )

    @property
    def num_features(self) -> int:
        """How many target layers are concatenated into the context (the input width of `fc` is this x hidden)."""
        return len(self.target_layer_ids)

    @classmethod
    def from_target_config(
        cls,
        target_config: PretrainedConfig,
        *,
        mask_token_id: int,
        num_hidden_layers: int = 1,
        block_size: int = 16,
        num_target_features: int | None = None,
        target_layer_ids: list[int] | None = None,
        intermediate_size: int | None = None,
        **kwargs: Any,
    ) -> DFlashConfig:
        """A drafter configuration shaped to fit `target_config` (Qwen3, Llama or any Llama-like text config).

        Copies hidden size, heads, head_dim, rope, rms eps, vocabulary and special ids from the target and picks
        `target_layer_ids` as the paper does (`num_target_features` defaults to `num_hidden_layers`, the z-lab
        convention). The mask id must be a real, unused row of the target's vocabulary, not its pad or eos.
        """
        text = target_config.get_text_config()
        hidden = text.hidden_size
        heads = text.num_attention_heads
        eos = text.eos_token_id if isinstance(text.eos_token_id, list) else [text.eos_token_id]
        reserved = {"pad_token_id": [text.pad_token_id], "eos_token_id": eos, "bos_token_id": [text.bos_token_id]}
        for name, ids in reserved.items():
            if mask_token_id in ids:
                raise ValueError(
                    f"mask_token_id={mask_token_id} is the target's {name}; the mask must be an otherwise unused token."
                )
        depth = text.num_hidden_layers
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(depth, num_target_features or num_hidden_layers)
        rope = getattr(text, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
        return cls(
            vocab_size=text.vocab_size,
            hidden_size=hidden,
            intermediate_size=intermediate_size or text.intermediate_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or hidden // heads,
            hidden_act=getattr(text, "hidden_act", "silu"),
            max_position_embeddings=text.max_position_embeddings,
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            rope_parameters=dict(rope),
            tie_word_embeddings=False,
            pad_token_id=text.pad_token_id,
            bos_token_id=text.bos_token_id,
            eos_token_id=text.eos_token_id,
            block_size=block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=list(target_layer_ids),
            num_target_layers=depth,
            **kwargs,
        )

    def to_dict(self) -> dict[str, Any]:
        """The z-lab dialect: `model_type` qwen3, DFlash fields nested, `auto_map` to the shipped `dflash.py`."""
        out = super().to_dict()
        for key in NESTED_KEYS:
            out.pop(key, None)
        out["model_type"] = ZLAB_MODEL_TYPE
        out["architectures"] = [ZLAB_ARCHITECTURE]
        out["auto_map"] = dict(ZLAB_AUTO_MAP)
        out["dflash_config"] = dict(self.dflash_config)
        return out

    def to_diff_dict(self) -> dict[str, Any]:
        """Same dialect as [`to_dict`], so `save_pretrained` writes a file the other runtimes read."""
        diff = super().to_diff_dict()
        full = self.to_dict()
        for key in NESTED_KEYS:
            diff.pop(key, None)
        for key in ("model_type", "architectures", "auto_map", "dflash_config", "block_size", "num_target_layers"):
            diff[key] = full[key]
        for key in ("layer_types", "sliding_window", "use_sliding_window", "rope_parameters", "head_dim"):
            diff.setdefault(key, full.get(key))
        return diff

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> DFlashConfig:
        """Reads our own files and the z-lab dialect (its `model_type` is "qwen3", which is expected here)."""
        config_dict = {k: v for k, v in config_dict.items() if k not in ("model_type", "auto_map")}
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> DFlashConfig:
        """Normalises any config carrying the DFlash fields (e.g. a `Qwen3Config` made by `AutoConfig`)."""
        if isinstance(config, cls):
            return config
        return cls.from_dict(config.to_dict())

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, **kwargs: Any) -> DFlashConfig:
        """Loads `config.json` from a directory or Hub id; both our files and z-lab's say `model_type: qwen3`.

        A missing or damaged file, a value of the wrong type or a missing `block_size` is refused with the file, the
        field and the fix (see `checkpoint_checks`), never replaced by defaults.
        """
        folder = check_path(pretrained_model_name_or_path)
        if folder is not None:
            read_config_file(folder)  # a clear error for a missing or unreadable file
        config_dict, kwargs = cls.get_config_dict(pretrained_model_name_or_path, **kwargs)
        where = str(folder / CONFIG_FILE) if folder is not None else f"{pretrained_model_name_or_path}/{CONFIG_FILE}"
        check_config_dict(config_dict, where)
        return cls.from_dict(config_dict, **kwargs)
