"""The value checks every config section's ``__post_init__`` shares: each error names the key it is about."""

from __future__ import annotations

from typing import Any

from mtl_decoder.errors import ConfigError, did_you_mean


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, f"{value!r} is not one of {', '.join(choices)}{did_you_mean(str(value), choices)}")


def check_positive(name: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(name, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")
