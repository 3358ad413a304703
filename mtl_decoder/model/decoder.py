"""The multi-task decoder: embedding -> L x (Pre-LN attention + expert block) -> final norm -> task heads.

ids -> embedding N(0, 0.02) [+ char-CNN and word-shape features] -> rows per route
    -> L x DecoderLayer: h = h + Attention(Norm(h)); h = h + Block(Norm(h), routes)
    -> final norm -> each task's head reads its route
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from mtl_decoder.config import CLASSIFICATION, SHARED, TAGGING, ModelConfig
from mtl_decoder.data.wordfeatures import N_CHAR_IDS, SHAPES
from mtl_decoder.model.crf import CRF
from mtl_decoder.model.experts import ExpertBlock, ExpertGroup, Gate, RouteLayout
from mtl_decoder.model.layers import Dropout, RotaryEmbedding, SelfAttention, SwiGLU, make_norm


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


class WordFeatures(nn.Module):
    """Evidence about each word beyond its sub-words, added to every sub-word of the word: a character CNN, an
    embedding of its shape class, and the sum of its hashed sparse features (word, prefixes, suffixes)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, char_dim = cfg.d_model, cfg.char_embedding
        self.char_emb = nn.Embedding(N_CHAR_IDS, char_dim, padding_idx=0) if char_dim else None
        self.conv = nn.Conv1d(char_dim, 2 * char_dim, kernel_size=3, padding=1) if char_dim else None
        self.char_proj = nn.Linear(2 * char_dim, d) if char_dim else None
        self.shape_emb = nn.Embedding(len(SHAPES), d) if cfg.word_features else None
        buckets = cfg.word_hash_buckets
        self.hash_emb = nn.Embedding(buckets, cfg.word_hash_dim, padding_idx=0) if buckets else None
        self.hash_proj = nn.Linear(cfg.word_hash_dim, d) if buckets else None

    def forward(
        self,
        token_word: torch.Tensor,
        char_ids: torch.Tensor | None = None,
        shape_ids: torch.Tensor | None = None,
        hash_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Features of the batch's U distinct words -- char_ids (U, K), shape_ids (U,), hash_ids (U, F) -- put on
        every sub-word: token_word (B, T) is each sub-word's distinct word, -1 off words -> (B, T, C).

        Each distinct word is computed once: in a batch of CoNLL + SST-2 sentences about half the words are
        repeats ('the', ',', '.').
        """
        vectors = 0.0
        if self.char_emb is not None:
            c = self.conv(self.char_emb(char_ids).transpose(1, 2))  # (U, 2D, K)
            c = c.masked_fill(char_ids.unsqueeze(1) == 0, -1e4).amax(-1)  # (U, 2D): max over the word's characters
            vectors = vectors + self.char_proj(F.gelu(c))  # (U, C)
        if self.shape_emb is not None:
            vectors = vectors + self.shape_emb(shape_ids)
        if self.hash_emb is not None:
            vectors = vectors + self.hash_proj(self.hash_emb(hash_ids).sum(-2))
        U = vectors.shape[0]
        vectors = F.pad(vectors, (0, 0, 0, 1))  # (U + 1, C): a zero last row for the sub-words of no word
        # an embedding lookup, not vectors[token_word]: on a CPU the latter's backward adds repeated rows up in a
        # thread-dependent order, so one batch's gradients would differ between runs in the last bits
        return F.embedding(torch.where(token_word >= 0, token_word, U), vectors)  # (B, T, C)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tasks: list[str], is_last: bool):
        super().__init__()
        self.attn_norm = make_norm(cfg.norm, cfg.d_model)
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, causal=cfg.attention == "causal")
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model)
        if not cfg.variant.gated:
            self.ffn = SwiGLU(cfg.d_model, cfg.mlp_width)
        else:
            self.ffn = ExpertBlock(
                cfg.variant,
                tasks,
                cfg.d_model,
                cfg.n_shared_experts,
                cfg.n_task_experts,
                cfg.expert_hidden,
                cfg.initial_shared_weight,
                shared_gate=not is_last,
            )
        self.dropout = Dropout(cfg.dropout)

    def forward(
        self, h: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor, layout: RouteLayout
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.feed_forward(self.attend(h, mask, rope), layout)

    def attend(self, h: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor) -> torch.Tensor:
        return h + self.dropout(self.attn(self.attn_norm(h), mask, rope))

    def feed_forward(self, h: torch.Tensor, layout: RouteLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        N, T, C = h.shape
        x = self.ffn_norm(h.view(N * T, C)[layout.token_index])  # (M, C): real tokens only, grouped by route
        if isinstance(self.ffn, SwiGLU):
            out, gates = self.ffn(x), {}
        else:
            out, gates = self.ffn(x, layout)
        h = h.view(N * T, C).index_add(0, layout.token_index, self.dropout(out).to(h.dtype)).view(N, T, C)
        return h, gates


class MTLDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig, tasks: list[TaskHeadSpec], vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.cfg, self.tasks, self.pad_id = cfg, list(tasks), pad_id
        names = [t.name for t in tasks]
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.word_features = (
            WordFeatures(cfg) if cfg.char_embedding or cfg.word_features or cfg.word_hash_buckets else None
        )
        self.drop = Dropout(cfg.dropout)
        self.rope = RotaryEmbedding(cfg.d_model // cfg.n_heads, cfg.rope_base)
        self.layers = nn.ModuleList(DecoderLayer(cfg, names, i == cfg.n_layers - 1) for i in range(cfg.n_layers))
        self.final_norm = make_norm(cfg.norm, cfg.d_model)
        self.heads = nn.ModuleDict({t.name: nn.Linear(cfg.d_model, len(t.labels)) for t in tasks})
        self.crfs = nn.ModuleDict(
            {t.name: CRF(list(t.labels)) for t in tasks if t.kind == TAGGING and cfg.tagging_decoder == "crf"}
        )
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():  # after the generic pass, which would overwrite a gate's own linear layer
            if isinstance(module, (ExpertGroup, Gate)):
                module.reset_parameters()
        for layer in self.layers:  # residual branches start at zero: every layer is the identity at init
            nn.init.zeros_(layer.attn.out.weight)
            if isinstance(layer.ffn, SwiGLU):
                nn.init.zeros_(layer.ffn.down.weight)

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def task(self, name: str) -> TaskHeadSpec:
        return self.tasks[self.task_names.index(name)]

    # ---------------------------------------------------------------------------------- routes

    def route_layout(
        self, attention_mask: torch.Tensor, tasks: list[str], present: dict[str, torch.Tensor] | None
    ) -> RouteLayout:
        """The rows each route takes: every example for ple/mlp; for cgc/mmoe only those a task asks for."""
        B = attention_mask.shape[0]
        everyone = torch.arange(B, device=attention_mask.device)
        variant = self.cfg.variant
        if not variant.gated:
            return RouteLayout.build({SHARED: everyone}, attention_mask)
        if variant.shared_route:  # the shared gate mixes every task's experts: all routes are needed
            return RouteLayout.build({**{t: everyone for t in self.task_names}, SHARED: everyone}, attention_mask)
        routes = {}
        for name in tasks:
            examples = everyone if present is None else present[name].nonzero().squeeze(1)
            if len(examples):
                routes[name] = examples
        return RouteLayout.build(routes, attention_mask)

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
        token_word: torch.Tensor | None = None,
        char_ids: torch.Tensor | None = None,
        shape_ids: torch.Tensor | None = None,
        hash_ids: torch.Tensor | None = None,
        **unused,
    ) -> MTLOutput:
        """input_ids, attention_mask: (B, T), right-padded. labels: task -> (B, T) tags or (B,) classes, -100 =
        no label. ``tasks``: heads to run (default: the labelled tasks, or all without labels)."""
        attention_mask = attention_mask.bool()
        B, T = input_ids.shape
        present = None if labels is None else {k: _has_label(v) for k, v in labels.items()}
        if tasks is None:
            tasks = [t for t in self.task_names if present is None or (t in present and present[t].any())]
        if present is not None:
            present = {t: present.get(t, torch.zeros(B, dtype=torch.bool, device=input_ids.device)) for t in tasks}
        layout = self.route_layout(attention_mask, tasks, present)
        if not layout.names:  # cgc/mmoe and no example asks for any task: nothing to run
            return MTLOutput(logits={}, examples={}, gates=[{} for _ in self.layers], layout=layout)

        x = self.embed(input_ids)  # (B, T, C)
        if self.word_features is not None:
            x = x + self.word_features(token_word, char_ids, shape_ids, hash_ids)
        rope = self.rope(T)
        # Every route of an example starts from the same embedding, so the first attention sub-layer is the
        # same on all of them: run it once per example, then give each route its own copy (its own row).
        everyone = torch.arange(B, device=input_ids.device)
        h = self.layers[0].attend(self.drop(x), self._attention_mask(attention_mask, everyone), rope)  # (B, T, C)
        h = h[layout.row_example]  # (N, T, C)
        mask = self._attention_mask(attention_mask, layout.row_example)
        gates = []
        for i, layer in enumerate(self.layers):
            h, layer_gates = layer.feed_forward(h, layout) if i == 0 else layer(h, mask, rope, layout)
            gates.append(layer_gates)

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
            out.logits[name] = self.heads[name](hidden)
            out.examples[name] = examples
            if labels is not None and name in labels:
                loss = self._task_loss(name, out.logits[name], labels[name][examples], word_index, examples)
                if loss is not None:
                    out.losses[name] = loss
        if out.losses:
            out.loss = torch.stack(list(out.losses.values())).sum()
        return out

    def _attention_mask(self, attention_mask: torch.Tensor, row_example: torch.Tensor) -> torch.Tensor | None:
        """Bidirectional: a (N, 1, 1, T) key mask (padding hidden from every query). Causal: None, and attention
        runs with is_causal; rows are right-padded, so no real token ever sees a pad key anyway."""
        if self.cfg.attention == "causal":
            return None
        return attention_mask[row_example][:, None, None, :]

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
        word_index: torch.Tensor | None,
        examples: torch.Tensor,
    ) -> torch.Tensor | None:
        if name in self.crfs:
            keep = _has_label(labels)
            if not keep.any():
                return None
            emissions, tags, mask = word_level(logits[keep], word_index[examples][keep], labels[keep])
            return self.crfs[name].nll(emissions, tags, mask).mean()
        if not (labels != -100).any():
            return None
        return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), ignore_index=-100)

    # ---------------------------------------------------------------------------------- decoding

    @torch.no_grad()
    def decode_tags(self, name: str, logits: torch.Tensor, word_index: torch.Tensor) -> list[list[int]]:
        """Word-level tag ids for each row of a tagging task's logits (first sub-word of every word)."""
        emissions, _, mask = word_level(logits, word_index)
        if name in self.crfs:
            return self.crfs[name].decode(emissions, mask)
        best = emissions.argmax(-1)
        return [row[: int(n)].tolist() for row, n in zip(best, mask.sum(1), strict=True)]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _has_label(labels: torch.Tensor) -> torch.Tensor:
    """(B,) whether each example carries a label: any word label for tagging, the class for classification."""
    return (labels != -100).any(dim=1) if labels.dim() == 2 else labels != -100


def word_level(
    logits: torch.Tensor, word_index: torch.Tensor, labels: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather first-sub-word logits into word order: (n, W, L) emissions, (n, W) tags, (n, W) prefix mask.

    word_index (n, T) gives each sub-word's word (-1 for special tokens and padding); words cut by truncation
    are absent, so the present words of a row are always a prefix 0..W_i-1.
    """
    n, _T, L = logits.shape
    prev = torch.cat([torch.full_like(word_index[:, :1], -1), word_index[:, :-1]], dim=1)
    first = (word_index >= 0) & (word_index != prev)  # (n, T)
    W = int(word_index.max().item()) + 1 if first.any() else 1
    rows, cols = first.nonzero(as_tuple=True)
    words = word_index[rows, cols]
    emissions = logits.new_zeros(n, W, L)
    emissions[rows, words] = logits[rows, cols]
    mask = torch.zeros(n, W, dtype=torch.bool, device=logits.device)
    mask[rows, words] = True
    tags = torch.full((n, W), -100, dtype=torch.long, device=logits.device)
    if labels is not None:
        tags[rows, words] = labels[rows, cols]
    return emissions, tags, mask
