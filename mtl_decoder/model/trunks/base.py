"""The trunk interface.

What training, saving, loading, logging, the model card, export, int8 and the state cache
ask of the way a model reads its trunk.

A ``Trunk`` is made from the model config alone (``trunks.trunk_for``), so the config-level questions (how it
describes itself, which precisions it supports, whether it reads a pretrained checkpoint) need no model; its
``assemble`` builds the model (trunk + PLE layers + heads) and binds itself to it as ``model.trunk_kind``, after
which the model-level questions (its identity, its cached states, what it saves) are answered for that model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from mtl_decoder.config import ExperimentConfig, ModelConfig
from mtl_decoder.model.projected_embedding import folded_state

if TYPE_CHECKING:
    from mtl_decoder.data.tokenization import TextEncoder
    from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec
    from mtl_decoder.model.pretrained.frozen import FrozenStates
    from mtl_decoder.model.pretrained.hub import BaseIdentity

PRECISIONS = ("fp32", "bf16", "fp16", "int8")


class Trunk(ABC):
    """One way of reading a trunk: builds the model and answers what the rest of the package asks of it."""

    name: ClassVar[str]
    """The registry name (``model.trunk.mode``, or 'native' and 'layer_mix' as resolved by ``trunks.trunk_name``)."""
    pretrained: ClassVar[bool] = False
    """Whether it reads a pretrained checkpoint: its tokenizer, a trunk.json identity and a trunk/ folder saved."""
    precisions: ClassVar[tuple[str, ...]] = PRECISIONS
    """The inference precisions it supports."""
    streams: ClassVar[bool] = False
    """Whether ``predict --stream`` (a causal KV cache over the native layers) can run it."""
    caches_states: ClassVar[bool] = False
    """Whether its states are computed once per token sequence and cached (the config then refuses what would
    make every sequence new, such as data.word_dropout)."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self._model: MultiTaskModel | None = None

    # ---------------------------------------------------------------------------------- building

    @abstractmethod
    def build(
        self,
        specs: list[TaskHeadSpec],
        encoder: TextEncoder,
        saved_trunk: Path | None,
        expected_identity: dict[str, Any] | None,
    ) -> MultiTaskModel:
        """A freshly initialised model of this trunk for these heads (see ``model.builder.build_model``)."""

    def assemble(
        self,
        specs: list[TaskHeadSpec],
        encoder: TextEncoder,
        saved_trunk: Path | None = None,
        expected_identity: dict[str, Any] | None = None,
    ) -> MultiTaskModel:
        """``build``, then ``bind``."""
        return self.bind(self.build(specs, encoder, saved_trunk, expected_identity))

    def bind(self, model: MultiTaskModel) -> MultiTaskModel:
        """Make this trunk the one ``model`` answers as ``model.trunk_kind``; returns the model."""
        model.__dict__["trunk_kind"] = self  # not a module: outside the state dict and device moves
        self._model = model
        return model

    @property
    def model(self) -> MultiTaskModel:
        if self._model is None:
            raise RuntimeError(f"trunk '{self.name}' has no model yet (assemble it first)")
        return self._model

    # ---------------------------------------------------------------------------------- identity and caching

    def identity(self) -> BaseIdentity | None:
        """What the cache keys and a saved folder's trunk.json record of a pretrained checkpoint (None: none)."""
        return None

    def cached_states(self) -> FrozenStates | None:
        """The module that computes and caches the frozen part's states, if any.

        The module that computes the frozen part's states once per token sequence and caches them (its
        ``cache``, ``precompute``, ``for_inference``, ``set_compute``); None: nothing is cached."""
        return None

    def use_inference_cache(self, cache_dir: str | Path | None = None, write: bool = False) -> None:
        """Make the state cache (if any) an inference one: read, written only with ``write``, bounded."""
        states = self.cached_states()
        if states is not None:
            states.for_inference(cache_dir, write=write)

    # ---------------------------------------------------------------------------------- training and saving

    def trained_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimizer updates."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def state_to_save(self) -> dict[str, torch.Tensor]:
        """What a model folder's weights file stores (and loading expects): a learned lexicon projection folded
        into its table (model/projected_embedding.py)."""
        return folded_state(self.model)

    @property
    def loads_strictly(self) -> bool:
        """Whether ``state_to_save`` is the whole state dict (else the rest comes from the checkpoint)."""
        return True

    def save_files(self, directory: Path) -> None:
        """Write the trunk's own files into a model folder being saved (none here)."""
        return None

    # ---------------------------------------------------------------------------------- describing itself

    def supports(self, precision: str) -> bool:
        return precision in self.precisions

    @abstractmethod
    def describe(self) -> str:
        """The shape of the model in a few words, for the training banner."""

    def card_lines(self, config: ExperimentConfig, identity: dict[str, Any] | None, trained: str) -> list[str]:
        """The model card's 'Base model' section; ``trained``: ' (N trained parameters)' or ''."""
        m = self.cfg
        return [f"A {self.name} trunk{trained}: {m.n_layers} layers, d_model {m.d_model}."]

    def export_base(self, model_dir: Path, expert: str | None) -> tuple[nn.Module, bool]:
        """The pretrained base model that ``export --trunk`` writes.

        The pretrained base model ``export --trunk`` writes, and whether its blocks hold experts to choose
        from; a UserError where this trunk has no checkpoint to export."""
        from mtl_decoder.errors import UserError

        raise UserError(
            f"{model_dir}: its trunk was trained from scratch (no model.trunk.pretrained); export --trunk writes "
            "a pretrained trunk as a Hugging Face checkpoint"
        )

    export_summary: ClassVar[str] = ""
    """What an exported checkpoint of this trunk computes, for its README."""
    attention_reaches_trunk: ClassVar[bool] = False
    """Whether model.attention applies to the pretrained blocks (an export then says is_causal false)."""
