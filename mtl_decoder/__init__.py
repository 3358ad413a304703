"""mtl-decoder: multi-task text models on a Pre-LN decoder trunk with a PLE expert/gate block in every layer.

from mtl_decoder import load_config, train, evaluate, predict_file, predict_texts, merge_predictions, load_model
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {  # name -> module: imported on first use, so `import mtl_decoder` stays light
    "load_config": "mtl_decoder.config",
    "ExperimentConfig": "mtl_decoder.config",
    "train": "mtl_decoder.training.trainer",
    "distill": "mtl_decoder.distill.run",
    "TrainResult": "mtl_decoder.training.state",
    "evaluate": "mtl_decoder.evaluation.evaluate",
    "predict_file": "mtl_decoder.prediction.predict",
    "predict_texts": "mtl_decoder.prediction.predict",
    "merge_predictions": "mtl_decoder.prediction.parts",
    "load_model": "mtl_decoder.saved",
    "save_model": "mtl_decoder.saved",
    "SavedModel": "mtl_decoder.saved",
    "Predictor": "mtl_decoder.inference.predictor",
    "MTLDecoder": "mtl_decoder.model.decoder",
}
__all__ = [*_API, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'mtl_decoder' has no attribute {name!r}")
