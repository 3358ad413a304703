"""Batch prediction: streaming file input in common formats, JSON-lines output in input order, nothing lost."""

from mtl_decoder.prediction.common import PredictSummary
from mtl_decoder.prediction.parts import merge_predictions
from mtl_decoder.prediction.predict import predict_file, predict_texts

__all__ = ["PredictSummary", "merge_predictions", "predict_file", "predict_texts"]
