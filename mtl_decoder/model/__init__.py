"""The PLE decoder: building blocks, their assembly and the builder.

The PLE decoder: building blocks (layers, experts, crf), their assembly (decoder) and the builder that turns a
config into a model."""

from mtl_decoder.config import SHARED
from mtl_decoder.model.builder import build_model
from mtl_decoder.model.decoder import MTLDecoder
from mtl_decoder.model.experts import ExpertBlock, ExpertGroup, Gate, RouteLayout
from mtl_decoder.model.heads import MTLOutput, MultiTaskModel, TaskHeadSpec, word_level

__all__ = [
    "SHARED",
    "ExpertBlock",
    "ExpertGroup",
    "Gate",
    "MTLDecoder",
    "MTLOutput",
    "MultiTaskModel",
    "RouteLayout",
    "TaskHeadSpec",
    "build_model",
    "word_level",
]
