"""Running a trained model: the ``Predictor`` (the one prediction path, used by training-time validation,
``evaluate`` and ``predict``) and its inference precisions."""

from mtl_decoder.inference.predictor import PRECISIONS, Prediction, Predictor, autocast_dtype

__all__ = ["PRECISIONS", "Prediction", "Predictor", "autocast_dtype"]
