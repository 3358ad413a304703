"""The diagnostics' default settings, in a module with no heavy imports (the CLI reads them to build its help)."""

from __future__ import annotations

MAX_OVERLAP = 0.05
"""debug-data: share of a validation/test split that may repeat train exactly (same labels) before it is an error."""
MAX_MISLABELLED = 0.01
"""debug-data: share of a validation/test split that may repeat train with other labels before it is an error
(CoNLL-2003 itself has a few such annotation disagreements, e.g. 'CENTRAL DIVISION' as MISC in train, O in test)."""

DIAGNOSE_EXAMPLES = 64
"""diagnose: examples read per task from the split."""

OVERFIT_EXAMPLES = 4
"""overfit: train examples per task in the one batch."""
OVERFIT_STEPS = 150
"""overfit: most optimizer steps (it stops as soon as every task is below the threshold)."""
OVERFIT_THRESHOLD = 0.05
"""overfit: the loss every task must fall below."""
OVERFIT_LR = 5e-3
"""overfit: constant AdamW learning rate (no warm-up, no decay, no weight decay)."""
