"""Training data from the Hugging Face hub (``data.hub_id`` in a task file), as the same ``Record``s files give."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mtl_decoder.data.formats import Record
from mtl_decoder.errors import UserError


def read_hub(hub_id: str, hub_config: str | None, split: str) -> Iterator[Record]:
    """Rows of a Hugging Face dataset split.

    ClassLabel ids become their names. A dataset that cannot be loaded
    (not found, offline, a loading script, which ``datasets`` no longer runs, an unknown config or split) is a
    one-line UserError naming it."""
    import datasets  # heavy: imported only when a hub dataset is used

    library_error = getattr(getattr(datasets, "exceptions", None), "DatasetsError", OSError)
    try:
        ds = datasets.load_dataset(hub_id, hub_config, split=split)
    except (library_error, OSError, ValueError, RuntimeError) as err:
        what = f"hub dataset '{hub_id}'" + (f" (config '{hub_config}')" if hub_config else "") + f" split '{split}'"
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"{what}: cannot be loaded ({reason}); check the task file's data.hub_id, data.hub_config and split "
            "names, or download the data and give its files as data.train / data.validation / data.test"
        ) from None
    names = {}
    for column, feature in ds.features.items():
        inner = getattr(feature, "feature", feature)
        if isinstance(inner, datasets.ClassLabel):
            names[column] = inner.names

    def name(labels: list[str], v: Any) -> Any:
        # -1 marks "no label" (e.g. GLUE test splits): it must not wrap around to the last class name.
        return labels[v] if isinstance(v, int) and 0 <= v < len(labels) else None

    for row, data in enumerate(ds, 1):
        for column, labels in names.items():
            value = data[column]
            data[column] = [name(labels, v) for v in value] if isinstance(value, list) else name(labels, value)
        yield Record(row, data)
