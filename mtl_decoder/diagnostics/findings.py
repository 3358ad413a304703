"""Findings: what a diagnostic check concluded, and how much it is likely to hurt.

Findings: what a diagnostic check concluded, with how much it is likely to hurt, so every command can rank
its warnings the same way and turn errors into an exit status.

Severity: ``error`` (training or evaluation will fail, or its numbers cannot be trusted: a pipeline should stop),
``warning`` (likely to cost quality), ``info`` (worth knowing). Within a severity, findings are ranked by
``harm``: a check's own weight times the share of the data (or of the model) it concerns, in [0, 1].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    severity: str
    """'error', 'warning' or 'info'."""
    code: str
    """A stable name for the kind of problem (tests and scripts match on it), e.g. 'padding_leak'."""
    message: str
    """One line a user can act on."""
    where: str = ""
    """What it concerns: 'ner/validation', 'layer_1.attn_norm', ... ('' for the whole run)."""
    harm: float = 0.0
    """How much it is likely to hurt, in [0, 1]; ranks findings within a severity."""
    examples: list[str] = field(default_factory=list)
    """A few concrete cases (file:line and text), so the user can look."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")
        self.harm = float(min(1.0, max(0.0, self.harm)))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """'error   ner/validation  overlap_mislabelled: ...' for the terminal."""
        where = f" [{self.where}]" if self.where else ""
        return f"{self.severity.upper():7s} {self.code}{where}: {self.message}"


def ranked(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then notes; within each, the most harmful first (stable otherwise)."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -f.harm))


def count(findings: list[Finding], severity: str) -> int:
    return sum(f.severity == severity for f in findings)


def codes(findings: list[Finding], severities: tuple[str, ...] = ("error", "warning")) -> set[str]:
    """The codes of the findings at these severities (by default the faults: errors and warnings)."""
    return {f.code for f in findings if f.severity in severities}


def finding_lines(findings: list[Finding], examples: int = 3) -> list[str]:
    """Ranked findings as terminal lines, each followed by up to ``examples`` of its cases."""
    lines = []
    for f in ranked(findings):
        lines.append(f.line())
        lines += [f"          e.g. {e}" for e in f.examples[:examples]]
    return lines
