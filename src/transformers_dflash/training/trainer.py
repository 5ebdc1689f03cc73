"""The DFlash training loop on `accelerate` (`accelerate launch` gives DDP/FSDP; a plain run uses one process).

Each step packs many blocks of each sequence into one drafter forward (see `blocks`), scores the outputs with the
target's frozen head (see `objective`), and takes an AdamW step (cosine schedule with warmup, gradient clipping).
The data position is the step count (see `batching.EpochPlan`: length-bucketed batches) and anchors are drawn from
(seed, epoch, sequence), so a run resumed from a checkpoint continues exactly as an uninterrupted one.

A step keeps the device busy: a background thread prepares the next host batches (padded ids, cached features;
pinned on a GPU), and everything else - target features when online, anchors, labels, positions, the mask - is
built on the device, vectorised over the batch (`anchors`, `blocks`). The main process appends metrics to
`train_log.jsonl` (with target tokens/s and the share of step time spent preparing data) and, periodically,
measures the real acceptance length tau on held-out prompts.

Why this file is a little over 400 lines: the step, its resume and its logging share the trainer's state and read
best together; the data path (`batching`, `anchors`, `blocks`, `features`), the objective and the checkpoint files
live beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import PreTrainedModel, get_cosine_schedule_with_warmup

from ..configuration_dflash import DFlashConfig
from ..drafter import DFlashDraftModel
from .anchors import draw_anchors
from .batching import EpochPlan, HostBatch, Prefetcher, collate
from .blocks import BlockBatch, build_block_batch, labels_from_predictions, loss_weights, soft_labels_from_top_k
from .checkpoint import latest_checkpoint, load_checkpoint, read_state, save_checkpoint
from .evaluate import measure_tau
from .features import FeatureCache, FeatureSource, TargetFeatures
from .objective import DraftObjective, ObjectiveOutput
from .resume import check_drafter_config, check_train_config, trim_log
from .sequences import TrainingSequence, response_vocabulary
from .writer_lock import WriterLock

LOG_FILE = "train_log.jsonl"


@dataclass
class TrainConfig:
    """Hyper-parameters of a run (defaults: the paper's optimiser; block counts sized for a small CPU run).

    Attributes:
        output_dir: run folder (`checkpoints/`, `train_log.jsonl`).
        epochs: passes over the sequences (anchors are redrawn each epoch).
        batch_size: sequences per process per micro-batch.
        grad_accum: micro-batches per optimizer step.
        learning_rate, weight_decay, warmup_ratio, max_grad_norm: AdamW, cosine schedule, clipping.
        num_anchors: blocks per sequence (paper 512; a sequence with fewer candidates uses them all).
        gamma: loss-weight decay; None = the paper's value for the block size.
        labels: "tokens" (the sequence's own next tokens: the target's greedy choices when responses were
            regenerated) or "target" (the target's argmax at each position, from the feature pass; a block position
            is then kept only while the text agreed with the target before it, see `blocks.consistent_prefix`).
        distill: weight in [0, 1] of the soft-label term: cross-entropy against the target's top-k distribution
            at each position (from the feature pass), mixed with the hard-label loss (see `objective`). 0 = off.
        top_k: how many of the target's most likely tokens form the soft labels (needed when distill > 0).
        restricted_vocab: score the loss over the response vocabulary only (faster; inference keeps the full head).
        mixed_precision: "auto" (bf16 on a GPU that supports it, else fp32), "no", "bf16" or "fp16".
        gradient_checkpointing: recompute draft layers in backward to save memory.
        attention: the packed blocks' mask: "dense" (a bool mask through sdpa), "flex" (a flex attention
            `BlockMask`: only the visible tiles are computed; not on the CPU, where torch has no flex backward) or
            "auto" (flex on CUDA, dense elsewhere).
        seed: seed of data order, anchors and init.
        bucket_window: micro-batches per length-sorted window of the epoch's order (batches of similar lengths,
            less padding); 0 = batches are plain slices of the permutation.
        log_every, eval_every, save_every: in optimizer steps; 0 = at the end of every epoch.
        keep_checkpoints: newest checkpoints kept.
        eval_max_new_tokens: tokens generated per held-out prompt when measuring tau.
        stop_after: stop (with a checkpoint) after this many steps, keeping the full schedule (time slicing).
    """

    output_dir: str
    epochs: int = 3
    batch_size: int = 1
    grad_accum: int = 1
    learning_rate: float = 6e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.04
    max_grad_norm: float = 1.0
    num_anchors: int = 512
    gamma: float | None = None
    labels: str = "tokens"
    distill: float = 0.0
    top_k: int = 0
    restricted_vocab: bool = False
    mixed_precision: str = "auto"
    gradient_checkpointing: bool = False
    attention: str = "auto"
    seed: int = 0
    bucket_window: int = 64
    log_every: int = 10
    eval_every: int = 0
    save_every: int = 0
    keep_checkpoints: int = 2
    eval_max_new_tokens: int = 128
    stop_after: int | None = None


def resolve_mixed_precision(requested: str) -> str:
    """ "auto" -> "bf16" on a CUDA device with bf16 support, else "no"; other values pass through."""
    if requested != "auto":
        return requested
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def _has_accelerator() -> bool:
    """Whether torch sees a GPU-like device (CUDA, ROCm, XPU, MPS, ...)."""
    return torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()


def _hardware(accelerator: Accelerator) -> str:
    """What the run trains on, for the model card."""
    device = accelerator.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    return f"{accelerator.num_processes} x {name}, torch {torch.__version__}"


class _Meter:
    """Sums of training statistics between two log lines (summed over processes when flushed)."""

    _SCALARS = ("loss", "blocks", "accepted", "micro_batches", "sequences", "context_tokens")

    def __init__(self, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        self.sums = torch.zeros(len(self._SCALARS) + 2 * block_size, device=device)
        self.seconds = {"data": 0.0, "target": 0.0}  # host time of this process, between two flushes
        self.start = time.perf_counter()

    def time(self, kind: str, since: float) -> float:
        """Adds the host time from `since` to now to `kind` ("data" or "target"); returns now."""
        now = time.perf_counter()
        self.seconds[kind] += now - since
        return now

    def add(self, out: ObjectiveOutput, sequences: int, context_tokens: int) -> None:
        """Adds one micro-batch."""
        counts = torch.tensor([1.0, sequences, context_tokens], device=self.sums.device)
        scalars = torch.cat([torch.stack([out.loss.detach().float(), out.blocks, out.accepted]), counts])
        self.sums += torch.cat([scalars, out.correct, out.total])

    def flush(self, accelerator: Accelerator) -> dict[str, Any]:
        """Averages since the last flush, and resets."""
        values = accelerator.reduce(self.sums.clone(), reduction="sum").tolist()
        sums = dict(zip(self._SCALARS, values, strict=False))
        correct = values[len(self._SCALARS) : len(self._SCALARS) + self.block_size]
        total = values[len(self._SCALARS) + self.block_size :]
        seconds = time.perf_counter() - self.start
        shares = {f"{kind}_share": round(value / seconds, 4) for kind, value in self.seconds.items()}
        self.sums.zero_()
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.start = time.perf_counter()
        return {
            "loss": sums["loss"] / max(sums["micro_batches"], 1),
            "acc_by_position": [round(c / t, 4) if t else None for c, t in zip(correct, total, strict=True)][1:],
            "train_accept_len": sums["accepted"] / max(sums["blocks"], 1),
            "samples_per_s": sums["sequences"] / seconds,
            "target_tokens_per_s": sums["context_tokens"] / seconds,
            "block_tokens_per_s": sums["blocks"] * self.block_size / seconds,
            **shares,  # data_share: waiting for / building batches; target_share: the online target forward
        }


class DFlashTrainer:
    """Trains a drafter against a frozen target.

    Args:
        target: the frozen target (its embedding and LM head are shared, never trained nor saved).
        drafter: the drafter to train (its config's `mask_token_id` / `target_layer_ids` are used throughout).
        sequences: training sequences (each holds at least one full block of response).
        config: the run's hyper-parameters.
        eval_prompts: held-out prompts (token ids, chat template applied) for tau.
        feature_cache: precomputed target features, one cache or several (a sequence is read from the first that
            holds it; every sequence must be in one); None computes them online every step.
        stop_token_ids: tokens that end a generation when measuring tau (the target's eos).
        run_info: facts about the run kept in the trainer state (e.g. the command line); hardware is added.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: DFlashDraftModel,
        sequences: list[TrainingSequence],
        config: TrainConfig,
        eval_prompts: list[list[int]] | None = None,
        feature_cache: FeatureCache | Sequence[FeatureCache] | None = None,
        stop_token_ids: list[int] | None = None,
        run_info: dict[str, str] | None = None,
    ) -> None:
        if config.labels not in ("tokens", "target"):
            raise ValueError(f"labels must be 'tokens' or 'target', got {config.labels!r}.")
        if config.attention not in ("auto", "dense", "flex"):
            raise ValueError(f"attention must be 'auto', 'dense' or 'flex', got {config.attention!r}.")
        if config.distill > 0 and config.top_k < 1:
            raise ValueError("distill > 0 needs the target's top-k soft labels: set top_k (e.g. --top-k 16).")
        self.config, self.sequences = config, sequences
        self.eval_prompts, self.stop_token_ids = eval_prompts or [], stop_token_ids or []
        self.accelerator = Accelerator(
            mixed_precision=resolve_mixed_precision(config.mixed_precision),
            step_scheduler_with_optimizer=False,  # one scheduler step per optimizer step, on any number of processes
            cpu=not _has_accelerator(),  # so `accelerate launch --multi_gpu` / torchrun on a CPU machine uses gloo
        )
        device = self.accelerator.device
        self.flex = config.attention == "flex" or (config.attention == "auto" and device.type == "cuda")
        if self.flex and device.type == "cpu":
            raise ValueError(
                "Flex attention has no backward pass on the CPU in torch; use --attention dense (or auto)."
            )
        self.target = target.to(device).eval().requires_grad_(False)
        self.block_size, self.mask_token_id = drafter.block_size, drafter.mask_token_id
        self.plan = EpochPlan(
            len(sequences), config.batch_size, config.grad_accum, self.accelerator.num_processes, config.seed,
            lengths=tuple(len(s.input_ids) for s in sequences) if config.bucket_window else None,
            bucket_window=config.bucket_window,
        )  # fmt: skip
        if self.plan.steps_per_epoch == 0:
            raise ValueError(
                f"{len(sequences)} sequences do not fill one step of {self.plan.per_step} "
                "(batch size x grad accumulation x processes); use more data or smaller batches."
            )
        self.total_steps = self.plan.steps_per_epoch * config.epochs
        vocabulary = response_vocabulary(sequences, self.stop_token_ids) if config.restricted_vocab else None
        # the drafter drafts over what its loss scores (with a warm start, also over what earlier runs scored)
        earlier = drafter.draft_vocab if vocabulary is not None and drafter.draft_vocab is not None else None
        drafter.set_draft_vocab(vocabulary if earlier is None else torch.cat([earlier.cpu(), vocabulary]))
        self.objective = DraftObjective(
            target.get_input_embeddings(), target.get_output_embeddings(), self.block_size, vocabulary, config.distill
        ).to(device)
        self.weights = loss_weights(self.block_size, config.gamma).to(device)
        self.features = FeatureSource(
            target,
            drafter.target_layer_ids,
            feature_cache,
            with_predictions=config.labels == "target",
            top_k=config.top_k if config.distill > 0 else 0,
        )
        uncached = self.features.uncached(s.id for s in sequences) if self.features.kind == "cached" else []
        if uncached:
            where = ", ".join(str(one.directory) for one, _ in self.features.caches)
            raise ValueError(
                f"{len(uncached)} of {len(sequences)} sequences (e.g. {uncached[0]!r}) are in none of the feature "
                f"caches ({where}); run `features` for these responses, or train with --features online."
            )
        if config.gradient_checkpointing:  # Transformers 5.24 renamed it activation checkpointing
            if hasattr(drafter, "activation_checkpointing_enable"):
                drafter.activation_checkpointing_enable({"use_reentrant": False})
            else:
                drafter.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        drafter.train()
        # The fused kernel makes one pass over memory: ~8x faster than the default on CPU, where AdamW is a large
        # share of a small drafter's step.
        fused = self.accelerator.device.type in ("cpu", "cuda")
        optimizer = torch.optim.AdamW(
            drafter.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused or None
        )
        warmup = round(config.warmup_ratio * self.total_steps)
        scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, self.total_steps)
        self.drafter_config = drafter.config
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(drafter, optimizer, scheduler)
        self.output_dir = Path(config.output_dir)
        run_info = {**(run_info or {}), "hardware": _hardware(self.accelerator), "features": self.features.kind}
        self.state: dict[str, Any] = {"step": 0, "epoch": 0, "wall_seconds": 0.0, "evals": [], "run_info": run_info}
        self.state["data"] = {"sequences": len(sequences)}

    @property
    def checkpoints_dir(self) -> Path:
        """Where checkpoints go."""
        return self.output_dir / "checkpoints"

    def _log(self, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            with (self.output_dir / LOG_FILE).open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")

    def host_batch(self, indices: list[int], epoch: int) -> HostBatch:
        """The host side of the micro-batch `indices` in `epoch` (cached features read here; pinned on a GPU)."""
        cached = self.features.kind == "cached"
        host = collate(
            self.sequences, indices, self.config.seed, epoch, self.block_size, self.config.num_anchors,
            features=(lambda seqs: self.features(seqs, torch.device("cpu"))) if cached else None,
        )  # fmt: skip
        return host.pin_memory() if self.accelerator.device.type == "cuda" else host

    def device_batch(self, host: HostBatch, meter: _Meter | None = None) -> tuple[BlockBatch, TargetFeatures]:
        """The packed blocks and target features of a host batch, built on the device without per-row work."""
        now = time.perf_counter()
        dev = host.to(self.accelerator.device)
        feats = dev.features
        if feats is None:
            now = meter.time("data", now) if meter else now
            feats = self.features.online(dev.input_ids, dev.lengths)  # (b, n, F * H) on the device
            now = meter.time("target", now) if meter else now
        targets, consistent = dev.input_ids, self.config.labels == "target"
        if consistent:
            targets = labels_from_predictions(dev.input_ids, feats.predictions)  # (b, n)
        soft = (None, None)
        if feats.top_ids is not None:
            soft = soft_labels_from_top_k(feats.top_ids, feats.top_logprobs)  # each (b, n, k)
        n = host.input_ids.shape[1]
        anchors, num_blocks = draw_anchors(
            dev.lengths, dev.response_starts, dev.keys, self.block_size, self.config.num_anchors, host.slots, n
        )
        batch = build_block_batch(
            dev.input_ids, targets, anchors, num_blocks, self.block_size, self.mask_token_id, self.weights,
            consistent=consistent, soft_ids=soft[0], soft_logprobs=soft[1],
        )  # fmt: skip
        batch.mask = batch.flex_mask() if self.flex else batch.attention_mask  # (b, 1, q, n + q) or a BlockMask
        if meter:
            meter.time("data", now)
        return batch, feats

    def make_batch(self, indices: list[int], epoch: int) -> tuple[BlockBatch, TargetFeatures]:
        """The packed blocks and target features of sequences `indices` in `epoch`."""
        return self.device_batch(self.host_batch(indices, epoch))

    def loss(self, batch: BlockBatch, feats: TargetFeatures) -> ObjectiveOutput:
        """One packed forward of the drafter and its objective."""
        mask = batch.mask
        if mask is None:  # a batch built outside `device_batch`
            mask = batch.flex_mask() if self.flex else batch.attention_mask
        hidden = self.model(
            noise_embeds=self.objective.embed(batch.noise_ids),
            context_hidden_states=feats.hidden,
            position_ids=batch.position_ids,
            attention_mask=mask,
        ).last_hidden_state  # (b, q, H)
        with self.accelerator.autocast():
            return self.objective(hidden, batch.labels, batch.weights, batch.soft_ids, batch.soft_logprobs)

    def evaluate(self) -> dict[str, Any] | None:
        """tau on the held-out prompts (main process; the others wait). None without eval prompts."""
        if not self.eval_prompts:
            return None
        record = None
        if self.accelerator.is_main_process:
            result = measure_tau(
                self.target,
                self.accelerator.unwrap_model(self.model),
                self.eval_prompts,
                self.config.eval_max_new_tokens,
                self.stop_token_ids,
            )
            record = {"step": self.state["step"], "tau": result.tau, "histogram": result.histogram}
            record.update(eval_seconds=round(result.seconds, 1), eval_tokens=result.new_tokens)
            self.state["evals"].append(record)
            self._log({"event": "eval", **record})
        self.accelerator.wait_for_everyone()
        return record

    def save(self) -> Path:
        """Atomic checkpoint of the current step."""
        self.state["config"] = asdict(self.config)
        return save_checkpoint(
            self.accelerator,
            self.checkpoints_dir,
            self.state["step"],
            self.state,
            self.drafter_config,
            self.config.keep_checkpoints,
            self.accelerator.unwrap_model(self.model).draft_vocab,
        )

    def resume(self) -> bool:
        """Loads the newest complete checkpoint of `output_dir` if there is one; True when it did.

        The resume rule (`resume.py`): a checkpoint written under other settings or another drafter shape is
        refused, and the log is cut back to the checkpoint's step.
        """
        found = latest_checkpoint(self.checkpoints_dir)
        if found is None:
            return False
        check_train_config(found, read_state(found), asdict(self.config), len(self.sequences))
        check_drafter_config(found, DFlashConfig.from_pretrained(found), self.drafter_config)
        self.state = load_checkpoint(self.accelerator, found)
        if self.accelerator.is_main_process:
            trim_log(self.output_dir / LOG_FILE, self.state["step"])
        self.accelerator.wait_for_everyone()
        return True

    def _due(self, every: int, step: int) -> bool:
        return step == self.total_steps or (step % every == 0 if every else step % self.plan.steps_per_epoch == 0)

    def train(self) -> dict[str, Any]:
        """Runs (or resumes) training to the end of the schedule or `stop_after`; returns the trainer state.

        The main process holds a `WriterLock` on `output_dir` meanwhile: a second run on the same folder stops at once
        with a clear error instead of writing over this one's checkpoints and log.
        """
        self.output_dir.mkdir(parents=True, exist_ok=True)
        main = self.accelerator.is_main_process
        with WriterLock(self.output_dir, "a training run") if main else contextlib.nullcontext():
            return self._train()

    def _train(self) -> dict[str, Any]:
        config, acc = self.config, self.accelerator
        if self.resume():
            self._log({"event": "resume", "step": self.state["step"]})
        elif acc.is_main_process:
            self._log({"event": "start", "total_steps": self.total_steps, "config": asdict(config)})
        stop = min(self.total_steps, config.stop_after or self.total_steps)
        start_wall, start_step = time.perf_counter() - self.state["wall_seconds"], self.state["step"]
        meter = _Meter(self.block_size, acc.device)
        bar = tqdm(total=stop, initial=start_step, desc="train", unit="step", disable=not acc.is_local_main_process)

        def host_step(step: int) -> tuple[int, list[HostBatch]]:
            epoch, micro_batches = self.plan.micro_batches(step, acc.process_index)
            return epoch, [self.host_batch(indices, epoch) for indices in micro_batches]

        prefetch = Prefetcher(host_step, start_step, stop)
        try:
            waited = time.perf_counter()
            for step, (epoch, hosts) in enumerate(prefetch, start=start_step):
                meter.time("data", waited)
                for k, host in enumerate(hosts):
                    batch, feats = self.device_batch(host, meter)
                    sync = contextlib.nullcontext() if k == len(hosts) - 1 else acc.no_sync(self.model)
                    with sync:
                        out = self.loss(batch, feats)
                        acc.backward(out.loss / len(hosts))
                    meter.add(out, len(host.ids), host.tokens)
                grad_norm = acc.clip_grad_norm_(self.model.parameters(), config.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                done = step + 1
                self.state.update(step=done, epoch=epoch, wall_seconds=time.perf_counter() - start_wall)
                bar.update(1)
                if self._due(config.log_every, done) or done == stop:
                    record = meter.flush(acc)
                    record.update(
                        step=done, epoch=epoch, lr=self.scheduler.get_last_lr()[0], grad_norm=float(grad_norm)
                    )
                    record["wall_seconds"] = round(self.state["wall_seconds"], 1)
                    self._log({"event": "train", **record})
                    bar.set_postfix(
                        loss=f"{record['loss']:.3f}", acc1=record["acc_by_position"][0],
                        tok_s=f"{record['target_tokens_per_s']:.0f}", data=f"{record['data_share']:.0%}",
                    )  # fmt: skip
                if self._due(config.eval_every, done):
                    self.evaluate()
                if self._due(config.save_every, done) or done == stop:
                    self.save()
                waited = time.perf_counter()
        finally:
            prefetch.close()
        bar.close()
        return self.state
