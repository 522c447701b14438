"""One glossary entry, and the glossary's sections."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Term:
    """One glossary entry."""

    name: str
    """The term as the docs write it."""
    aliases: tuple[str, ...]
    """Other spellings and names that look it up (case-insensitive)."""
    meaning: str
    """What it is, in a few sentences."""
    elsewhere: str
    """How frameworks name it (or the same thing) differently; empty if they agree."""
    measure: str
    """The parlab commands that measure or compute it, ``;``-separated."""
    group: str
    """Section of the glossary."""
    formula: str = ""
    """How it is computed, where it has a formula (plain text, the docs' notation)."""


G_STATE, G_COMM, G_SPLIT, G_ROUTE, G_TIME, G_SERVE, G_PARLAB = (
    "Training state: replicated to sharded",
    "Collectives and bandwidth",
    "Cutting the model: TP, SP, CP, PP",
    "Dynamic routing: experts",
    "Time: overlap, utilisation, failures",
    "Serving",
    "parlab's own words: ledger, plans, decisions",
)

GROUPS = (G_STATE, G_COMM, G_SPLIT, G_ROUTE, G_TIME, G_SERVE, G_PARLAB)
"""The sections, in the order ``docs/glossary.md`` prints them."""
