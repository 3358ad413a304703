"""Running a trained model: the Predictor and its options.

Running a trained model: the ``Predictor`` (the one prediction path, used by training-time validation,
``evaluate`` and ``predict``), the ``InferenceOptions`` every inference path takes, and its precisions."""

from mtl_decoder.inference.options import PRECISIONS, InferenceOptions, autocast_dtype
from mtl_decoder.inference.predictor import Prediction, Predictor

__all__ = ["PRECISIONS", "InferenceOptions", "Prediction", "Predictor", "autocast_dtype"]
