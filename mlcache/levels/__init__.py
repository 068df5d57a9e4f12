"""Storage levels. Each module holds one level behind the :class:`Level` protocol."""
from .base import Level, Victims

__all__ = ["Level", "Victims"]
