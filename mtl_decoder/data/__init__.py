"""Task data, from files to batches.

Task data, from files to batches: file formats (``formats``), tasks' examples and label sets (``tasks``,
``iob``), text to sub-word ids (``tokenization``), per-word features (``wordfeatures``) and multi-task batches
(``batching``)."""
