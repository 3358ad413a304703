"""Training with HF Accelerate: loss balancing, validation and selection, checkpoints and resume."""

from mtl_decoder.training.state import TrainResult
from mtl_decoder.training.trainer import train

__all__ = ["TrainResult", "train"]
