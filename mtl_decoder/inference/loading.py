"""``load_for_inference``: how every inference path loads its model.

``load_for_inference``: the one way every inference path (``predict_texts``, ``predict_file`` and its shards,
``--stream``, ``evaluate``) loads the model it runs, as its InferenceOptions say."""

from __future__ import annotations

from pathlib import Path

from mtl_decoder.inference.options import InferenceOptions, autocast_dtype
from mtl_decoder.saved import SavedModel, load_model


def load_for_inference(model: SavedModel | str | Path, options: InferenceOptions) -> SavedModel:
    """Load the model that ``options`` run.

    The model ``options`` run: the precision checked against the device it goes to before anything is loaded,
    then loaded there (a SavedModel given is used as it is, on its own device) and its gate table applied."""
    if isinstance(model, SavedModel):
        autocast_dtype(options.precision, next(model.model.parameters()).device)
        saved = model
    else:
        device = options.target_device()
        autocast_dtype(options.precision, device)
        saved = load_model(model, device)
    if options.gate_table is not None:
        from mtl_decoder.inference.gate_apply import apply_gate_table

        apply_gate_table(saved, options.gate_table)
    return saved
