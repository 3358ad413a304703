"""Task heads over a trunk's routes: what every multi-task model shares, whatever its trunk.

A ``MultiTaskModel`` decides which routes a batch runs (``route_layout``, from the variant table), asks its
trunk for the residual stream of every route (``encode``: the native decoder, a pretrained Hugging Face trunk,
or native layers over a frozen one), then runs each task's head on its route: a linear layer per token for
tagging (with an optional CRF), pooled for classification (a linear map, or a small MLP with
``model.classifier_hidden``: work per text, not per word). Each task's loss is masked to the examples that carry
its label and averaged per example (PLE paper, Eq. 9).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mtl_decoder.config import CLASSIFICATION, SHARED, TAGGING, ModelConfig
from mtl_decoder.model.crf import CRF
from mtl_decoder.model.experts import ExpertBlock, RouteLayout


@dataclass(frozen=True)
class TaskHeadSpec:
    """What the model needs to know of a task: its name, kind and label set."""

    name: str
    kind: str
    labels: tuple[str, ...]


@dataclass
class MTLOutput:
    logits: dict[str, torch.Tensor]
    """Per task: (n_k, T, L) for tagging, (n_k, L) for classification."""
    examples: dict[str, torch.Tensor]
    """Per task: the (n_k,) batch examples its logits rows belong to."""
    losses: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per task with labels in the batch: its loss, masked to the examples carrying its label."""
    loss: torch.Tensor | None = None
    """Sum of the task losses (the trainer balances them itself)."""
    gates: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """Per layer: gate name -> (M_route, E) weights over real tokens (see ``layout``)."""
    layout: RouteLayout | None = None
    """Which examples and token positions the gates' rows are."""
    hidden: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per task, with ``keep_hidden``: what its head reads (after the final norm): (n_k, T, C) states for tagging,
    the (n_k, C) pooled state for classification."""


class MultiTaskModel(nn.Module):
    """Routes, heads, losses and decoding; subclasses provide the trunk (``encode``, ``final_norm``)."""

    final_norm: nn.Module
    """Applied to a route's stream before its head (the trunk's last norm; Identity where the trunk applies it)."""
    trunk_kind: Any
    """The way this model reads its trunk: a model.trunks ``Trunk``, bound by the trunk that built the model (a
    decoder built directly has none until ``NativeTrunk(cfg).bind(model)``)."""

    def __init__(self, cfg: ModelConfig, tasks: list[TaskHeadSpec], d_model: int):
        super().__init__()
        self.cfg, self.tasks = cfg, list(tasks)
        self.heads = nn.ModuleDict({t.name: task_head(t, d_model, cfg.classifier_hidden, cfg.dropout) for t in tasks})
        self.crfs = nn.ModuleDict(
            {t.name: CRF(list(t.labels)) for t in tasks if t.kind == TAGGING and cfg.tagging_decoder == "crf"}
        )

    # ---------------------------------------------------------------------------------- what the trunk provides

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layout: RouteLayout, features: dict[str, Any]
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """The residual stream of every row of ``layout`` (N, T, C) and each layer's gate weights."""
        raise NotImplementedError

    def expert_blocks(self) -> list[ExpertBlock | None]:
        """Each layer's expert block (None for a layer without gates), in layer order."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------- tasks and routes

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def task(self, name: str) -> TaskHeadSpec:
        return self.tasks[self.task_names.index(name)]

    def route_layout(
        self, attention_mask: torch.Tensor, tasks: list[str], present: dict[str, torch.Tensor] | None
    ) -> RouteLayout:
        """The rows each route takes after the fork.

        Every example for ple/mlp; for the other gated variants only
        those a task asks for. Gated layouts also describe the shared bottom they fork from (``layout.bottom``:
        one row per example of any route), which the layers below the first expert layer run on."""
        B = attention_mask.shape[0]
        everyone = torch.arange(B, device=attention_mask.device)
        variant = self.cfg.variant
        if not variant.gated:  # one stream: the layout is its own bottom, nothing forks
            return RouteLayout.build({SHARED: everyone}, attention_mask)
        if variant.shared_route:  # the shared gate mixes every task's experts: all routes are needed
            routes = {**{t: everyone for t in self.task_names}, SHARED: everyone}
            return RouteLayout.build(routes, attention_mask, fork=True)
        routes = {}
        for name in tasks:
            examples = everyone if present is None else present[name].nonzero().squeeze(1)
            if len(examples):
                routes[name] = examples
        return RouteLayout.build(routes, attention_mask, fork=True)

    def head_route(self, task: str) -> str:
        return self.cfg.variant.head_route(task)

    # ---------------------------------------------------------------------------------- forward

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: dict[str, torch.Tensor] | None = None,
        tasks: list[str] | None = None,
        word_index: torch.Tensor | None = None,
        word_read: torch.Tensor | None = None,
        route_examples: dict[str, torch.Tensor] | None = None,
        keep_hidden: bool = False,
        **features: Any,
    ) -> MTLOutput:
        """Run the model on a batch.

        input_ids, attention_mask: (B, T), right-padded. labels: task -> (B, T) tags or (B,) classes, -100 =
        no label. ``tasks``: heads to run (default: the labelled tasks, or all without labels). ``word_index`` (B, T)
        each sub-word's word (the heads do not need it); ``word_read`` (B, W) the position each word is read from
        (the collator's, from the encoder's WordAlignment; the CRF loss needs it). ``features``: per-word inputs
        from the collator (token_word, char_ids, shape_ids, hash_ids), passed to the trunk.
        ``route_examples``: task -> (B,) bool, examples whose task route runs besides those with its label (cgc/mmoe
        route only those; distillation adds the examples that carry a teacher target). ``keep_hidden``: each
        task's head input is kept in ``out.hidden`` (distillation's state targets)."""
        attention_mask = attention_mask.bool()
        B = input_ids.shape[0]
        present = None if labels is None else {k: _has_label(v) for k, v in labels.items()}
        if tasks is None:
            tasks = [t for t in self.task_names if present is None or (t in present and present[t].any())]
        if present is not None:
            present = {t: present.get(t, torch.zeros(B, dtype=torch.bool, device=input_ids.device)) for t in tasks}
            if route_examples is not None:
                present = {t: present[t] | route_examples[t] if t in route_examples else present[t] for t in tasks}
        layout = self.route_layout(attention_mask, tasks, present)
        if not layout.names:  # cgc/mmoe and no example asks for any task: nothing to run
            return MTLOutput(logits={}, examples={}, gates=[{} for _ in self.expert_blocks()], layout=layout)

        h, gates = self.encode(input_ids, attention_mask, layout, features)  # (N, T, C)
        out = MTLOutput(logits={}, examples={}, gates=gates, layout=layout)
        for name in tasks:
            route = self.head_route(name)
            if route not in layout.names:
                continue
            rows = layout.rows(route)
            hidden = self.final_norm(h[rows])  # (n_k, T, C)
            examples = layout.row_example[rows]
            if self.task(name).kind == CLASSIFICATION:
                hidden = self._pool(hidden, attention_mask[examples])  # (n_k, C)
            if keep_hidden:
                out.hidden[name] = hidden
            out.logits[name] = self.heads[name](hidden)
            out.examples[name] = examples
            if labels is not None and name in labels:
                loss = self._task_loss(name, out.logits[name], labels[name][examples], word_read, examples)
                if loss is not None:
                    out.losses[name] = loss
        if out.losses:
            out.loss = torch.stack(list(out.losses.values())).sum()
        return out

    def _pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.cfg.attention == "causal":  # only the last real token has read the whole sentence
            last = attention_mask.sum(1) - 1  # (n,)
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)

    def _task_loss(
        self,
        name: str,
        logits: torch.Tensor,
        labels: torch.Tensor,
        word_read: torch.Tensor | None,
        examples: torch.Tensor,
    ) -> torch.Tensor | None:
        """A task's loss: the mean over the examples that carry its label.

        The mean over the examples that carry the task's label of each example's loss (PLE, Eq. 9): a tagged
        sentence counts once whatever its length, as a classified one does."""
        keep = _has_label(labels)
        if not keep.any():
            return None
        if name in self.crfs:
            if word_read is None:
                raise ValueError(f"task '{name}' has a CRF: its loss needs word_read (the collator's batch has it)")
            emissions, tags, mask = word_level(logits[keep], word_read[examples][keep], labels[keep])
            return self.crfs[name].nll(emissions, tags, mask).mean()
        if labels.dim() == 1:  # classification: one label per example
            return F.cross_entropy(logits[keep].float(), labels[keep])
        logits, labels = logits[keep].float(), labels[keep]  # (n, T, L), (n, T)
        per_token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")  # (n, T)
        counted = (labels != -100).sum(1)  # (n,) >= 1: every kept example has a labelled token
        return (per_token.sum(1) / counted).mean()

    # ---------------------------------------------------------------------------------- decoding

    @torch.no_grad()
    def decode_tags(self, name: str, logits: torch.Tensor, word_read: torch.Tensor) -> list[list[int]]:
        """Word-level tag ids of a tagging task's logits.

        Word-level tag ids for each row of a tagging task's logits, read where ``word_read`` (n, W) says (the
        batch's, from the encoder's WordAlignment): one per word that reached the model whole."""
        emissions, _, mask = word_level(logits, word_read)
        if name in self.crfs:
            return self.crfs[name].decode(emissions, mask)
        best = emissions.argmax(-1)
        return [row[: int(n)].tolist() for row, n in zip(best, mask.sum(1), strict=True)]

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


def task_head(task: TaskHeadSpec, d_model: int, classifier_hidden: int = 0, dropout: float = 0.0) -> nn.Module:
    """A task's head over what it reads: (…, d_model) -> (…, n_labels).

    A linear map, per token for tagging. A classification head with ``classifier_hidden`` > 0 is Linear -> GELU ->
    dropout -> Linear over the pooled state: a wider path than the trunk's width costs one small matrix per text, not
    per word (``model.classifier_hidden``)."""
    labels = len(task.labels)
    if task.kind != CLASSIFICATION or not classifier_hidden:
        return nn.Linear(d_model, labels)
    return nn.Sequential(
        nn.Linear(d_model, classifier_hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(classifier_hidden, labels)
    )


def init_head(head: nn.Module, std: float = 0.02) -> None:
    """Every linear map of a head drawn from N(0, std²), biases zero (a pretrained trunk's heads: no generic init)."""
    for module in head.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.bias)


def _has_label(labels: torch.Tensor) -> torch.Tensor:
    """(B,) whether each example carries a label: any word label for tagging, the class for classification."""
    return (labels != -100).any(dim=1) if labels.dim() == 2 else labels != -100


def word_level(
    logits: torch.Tensor, word_read: torch.Tensor, labels: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each word's logits and label at its read position.

    Each word's logits (and label) at its read position, in word order: (n, W, L) emissions (zero past a row's
    words), (n, W) tags (-100 without labels or past the words), (n, W) prefix mask.

    word_read (n, W) holds the position each word is read from, -1 past the row's words (``WordAlignment.reads``,
    padded by the collator): where a word is read is decided there, once, not here.
    """
    L = logits.shape[-1]
    mask = word_read >= 0  # (n, W)
    at = word_read.clamp(min=0)  # (n, W)
    gathered = logits.gather(1, at.unsqueeze(-1).expand(-1, -1, L))  # (n, W, L)
    emissions = torch.where(mask.unsqueeze(-1), gathered, torch.zeros((), dtype=logits.dtype, device=logits.device))
    tags = torch.full(mask.shape, -100, dtype=torch.long, device=logits.device)
    if labels is not None:
        tags = torch.where(mask, labels.gather(1, at), tags)
    return emissions, tags, mask
