"""Distillation: a fast native student learns from a saved teacher's soft targets (``mtl-decoder distill``)."""

from mtl_decoder.distill.run import DistillTrainer, distill

__all__ = ["DistillTrainer", "distill"]
