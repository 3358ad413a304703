"""The PLE decoder: building blocks (layers, experts, crf), their assembly (decoder) and the builder that turns a
config into a model."""

from mtl_decoder.config import SHARED
from mtl_decoder.model.builder import build_model
from mtl_decoder.model.decoder import MTLDecoder, MTLOutput, TaskHeadSpec, word_level
from mtl_decoder.model.experts import ExpertBlock, ExpertGroup, Gate, RouteLayout

__all__ = [
    "SHARED",
    "ExpertBlock",
    "ExpertGroup",
    "Gate",
    "MTLDecoder",
    "MTLOutput",
    "RouteLayout",
    "TaskHeadSpec",
    "build_model",
    "word_level",
]
