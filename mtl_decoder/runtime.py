"""Where code runs: the device chosen when the caller names none. Library code never hard-codes a device."""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    """The machine's accelerator (CUDA, XPU, MPS, ...) when it has one, else the CPU."""
    found = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    return found if found is not None else torch.device("cpu")
