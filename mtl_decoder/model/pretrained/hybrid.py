"""Mode 'hybrid': a pretrained trunk's lower blocks cached, its top blocks trained.

Mode 'hybrid': the lower blocks of a pretrained trunk frozen and cached, its top ``train_top`` blocks trained on
top of the cache, the native PLE layers (model.n_layers, possibly none) above them.

    ids -> blocks 1..N-k (frozen; the residual stream after block N-k cached per token sequence, layermix.py)
        -> blocks N-k+1..N with PLE in their MLPs (top_mode 'upcycle': trained copies of the MLP; 'lora': the
           frozen MLP plus low-rank updates; adapters.py), run by the checkpoint's own model class on the cached
           states (``inputs_embeds``), its final norm after them
        -> [projection to d_model + model.n_layers native decoder layers, route by route] -> heads

The expensive part (N-k blocks) runs once per text; a step costs k pretrained blocks. At step 0 the model
computes the pretrained function: the top blocks' expert blocks start as the pretrained MLP (as in modes upcycle
and lora), and the cached states are what the lower blocks compute (to the cache's float16 rounding).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from mtl_decoder.config import ModelConfig
from mtl_decoder.errors import UserError
from mtl_decoder.model.decoder import MTLDecoder
from mtl_decoder.model.experts import ExpertBlock, RouteLayout
from mtl_decoder.model.heads import TaskHeadSpec, init_head, task_head
from mtl_decoder.model.pretrained.adapters import install_expert_blocks, routing
from mtl_decoder.model.pretrained.finetuned import enable_gradient_checkpointing, freeze_all_but_updates
from mtl_decoder.model.pretrained.hub import BaseIdentity, decoder_layers, keep_first_layers
from mtl_decoder.model.pretrained.layermix import LayerStates, layered_cache


def split_trunk(base: nn.Module, start: int) -> nn.Module:
    """Split a pretrained trunk after a block.

    Cut ``base`` after block ``start`` in place (it keeps its embeddings and blocks 1..start: the part whose
    states are cached) and return the blocks above as a model of the same class: blocks start+1..N, the final
    norm and the position machinery, no token embedding (it reads the cached states as ``inputs_embeds``)."""
    layers = decoder_layers(base)
    embedding = base.get_input_embeddings()
    top = copy.copy(base)  # same class and attributes, so the family's own forward runs ...
    top.__dict__.update({k: copy.copy(v) for k, v in vars(base).items() if isinstance(v, dict | set)})  # own hooks
    top._modules = {}  # ... on children of its own
    for name, child in base.named_children():
        if child is layers:
            top._modules[name] = nn.ModuleList(list(layers)[start:])
        elif child is embedding:
            top._modules[name] = None
        else:  # the final norm, rotary tables, dropout: small, and the top's own to train
            top._modules[name] = copy.deepcopy(child)
    top.config = copy.deepcopy(base.config)
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(top.config, key):
            setattr(top.config, key, len(layers) - start)
    if isinstance(getattr(top.config, "layer_types", None), list):
        top.config.layer_types = top.config.layer_types[start:]
    positions = getattr(top, "wpe", None)  # GPT-2 adds its learned positions to inputs_embeds: already in them
    if isinstance(positions, nn.Embedding):
        with torch.no_grad():
            positions.weight.zero_()
        positions.requires_grad_(False)
    keep_first_layers(base, start)
    return top


class HybridDecoder(MTLDecoder):
    """Trained top pretrained blocks (with PLE) over cached lower blocks, native layers (if any) on top."""

    def __init__(self, cfg: ModelConfig, tasks: list[TaskHeadSpec], base: nn.Module, identity: BaseIdentity):
        trunk = cfg.trunk
        start = identity.layers - trunk.train_top
        if start < 1:
            raise UserError(
                f"model.trunk.train_top: {trunk.train_top} trained blocks leave none of the {identity.layers} blocks "
                f"of '{identity.source}' to cache: use fewer, or mode upcycle/lora to train them all"
            )
        super().__init__(cfg, tasks, vocab_size=1)  # the native layers; their init never reaches the trunk's
        self.identity, H = identity, identity.hidden_size
        self.trunk_config = copy.deepcopy(base.config)
        """The config of the whole trunk (what a saved model's trunk/config.json holds), before the split."""
        self.top = split_trunk(base, start)
        self.states = self.make_states(base, identity, start)
        self._blocks = install_expert_blocks(self.top, cfg, self.task_names, mode=trunk.top_mode)
        if trunk.top_mode == "lora":
            freeze_all_but_updates(self.top, trunk)
        if trunk.gradient_checkpointing:
            enable_gradient_checkpointing(self.top)
        if cfg.n_layers:  # the top's final norm already ran: a projection to the native layers' width
            self.embed = nn.Linear(H, cfg.d_model)
            nn.init.normal_(self.embed.weight, std=0.02)
            nn.init.zeros_(self.embed.bias)
        else:  # no native layers: the heads read the top blocks' normed output, as in modes upcycle and lora
            self.embed = nn.Identity()
            self.final_norm = nn.Identity()
            self.heads = nn.ModuleDict({t.name: task_head(t, H, cfg.classifier_hidden, cfg.dropout) for t in tasks})
            for head in self.heads.values():
                init_head(head)

    def make_states(self, base: nn.Module, identity: BaseIdentity, start: int) -> LayerStates:
        """What computes and caches block ``start``'s states (mode echo_hybrid reads every text twice)."""
        trunk = self.cfg.trunk
        return LayerStates(
            base, identity, layered_cache(base, identity, [start], trunk.dtype, trunk.cache_dir), [start]
        )

    def expert_blocks(self) -> list[ExpertBlock | None]:
        return [*self._blocks, *super().expert_blocks()]

    def embed_tokens(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("HybridDecoder's routes start apart, above the trained top blocks (embed_routes)")

    def embed_routes(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layout: RouteLayout
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """Every row of ``layout`` through the top blocks from its example's cached states: (N, T, C), gates."""
        states = self.states(input_ids, attention_mask)  # (B, T, H): the residual stream after the cached blocks
        rows = layout.row_example
        with routing(layout) as state:
            out = self.top(
                inputs_embeds=states[rows],
                attention_mask=attention_mask[rows].long(),
                is_causal=self.cfg.trunk.top_attention == "causal",
                use_cache=False,
            )
        gates = state.gates or [{} for _ in self._blocks]  # hard sharing with upcycle: the blocks' own MLPs
        return self.embed(out.last_hidden_state.float()), gates  # (N, T, C)
