"""Task data, from files to batches.

File formats (``formats``), tasks' examples and label sets (``tasks``,
``iob``), text to sub-word ids (``tokenization``), per-word features (``wordfeatures``) and multi-task batches
(``batching``)."""
