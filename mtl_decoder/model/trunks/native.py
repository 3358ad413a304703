"""The native trunk: token embedding and ``model.n_layers`` PLE decoder layers, trained from scratch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtl_decoder.config import ExperimentConfig
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model.decoder import MTLDecoder
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec
from mtl_decoder.model.trunks.base import Trunk


class NativeTrunk(Trunk):
    """``MTLDecoder``: the tokenizer trained on the data, every weight trained; the only trunk that streams."""

    name = "native"
    streams = True

    def build(
        self,
        specs: list[TaskHeadSpec],
        encoder: TextEncoder,
        saved_trunk: Path | None,
        expected_identity: dict[str, Any] | None,
    ) -> MultiTaskModel:
        return MTLDecoder(self.cfg, specs, vocab_size=encoder.vocab_size, pad_id=encoder.pad_id)

    def describe(self) -> str:
        return f"{self.cfg.n_layers} layers x d_model {self.cfg.d_model}"

    def card_lines(self, config: ExperimentConfig, identity: dict[str, Any] | None, trained: str) -> list[str]:
        m = self.cfg
        tokenizer = (
            f"its teacher's tokenizer, and a token-embedding table that started as the teacher's "
            f"({m.lexicon.source}, projection {m.lexicon.projection}; see 'Distilled from')"
            if m.lexicon.enabled
            else f"tokenizer trained on the training data ({config.tokenizer.kind}, vocabulary "
            f"{config.tokenizer.vocab_size:,})"
        )
        return [
            f"A native decoder trained from scratch{trained}: {m.n_layers} layers, d_model {m.d_model}, {m.n_heads} "
            f"heads, {m.attention} attention, {tokenizer}.",
        ]
