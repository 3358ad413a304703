"""Mode 'upcycle': a pretrained trunk's MLPs turned into trained expert blocks.

Mode 'upcycle': a pretrained trunk with every block's MLP turned into its expert block of trained copies, all
weights trained (model/pretrained/finetuned.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec
from mtl_decoder.model.trunks.base import PRECISIONS
from mtl_decoder.model.trunks.pretrained import PretrainedTrunk


class UpcycleTrunk(PretrainedTrunk):
    """``PretrainedDecoder`` with copied experts: the model's weights file holds every trunk weight."""

    name = "upcycle"
    weights_in_model_file = True
    lora: ClassVar[bool] = False
    precisions = tuple(p for p in PRECISIONS if p != "int8")  # grouped expert products quantize_dynamic misses
    attention_reaches_trunk = True
    export_summary = "every block's attention and norms as fine-tuned, and the MLP of one expert"

    def build(
        self,
        specs: list[TaskHeadSpec],
        encoder: TextEncoder,
        saved_trunk: Path | None,
        expected_identity: dict[str, Any] | None,
    ) -> MultiTaskModel:
        from mtl_decoder.model.pretrained.finetuned import PretrainedDecoder

        base, identity = self.load_base(saved_trunk, expected_identity)
        return PretrainedDecoder(self.cfg, specs, base, identity, lora=self.lora)

    def checkpoint_base(self) -> nn.Module:
        return self.model.trunk

    def mode_line(self, identity: dict[str, Any]) -> str:
        return (
            "upcycle: every block's MLP became its expert block (experts started as copies of the pretrained MLP), "
            "all weights fine-tuned"
        )

    def export_base(self, model_dir: Path, expert: str | None) -> tuple[nn.Module, bool]:
        return self.model.trunk, True
