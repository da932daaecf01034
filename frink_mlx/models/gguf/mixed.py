"""Families still to come (arch.py rule 10)."""

from .plan import ArchSpec

ARCHS: dict[str, ArchSpec] = {}
