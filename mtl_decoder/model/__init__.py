"""The PLE decoder: building blocks (layers, experts, crf) and their assembly (decoder)."""

from mtl_decoder.model.decoder import MTLDecoder, MTLOutput, TaskHeadSpec, word_level
from mtl_decoder.model.experts import SHARED, ExpertBlock, ExpertGroup, Gate, RouteLayout

__all__ = [
    "SHARED",
    "ExpertBlock",
    "ExpertGroup",
    "Gate",
    "MTLDecoder",
    "MTLOutput",
    "RouteLayout",
    "TaskHeadSpec",
    "word_level",
]
