"""The mlcache error family, organised by failure domain.

Every error carries the fields a caller needs to react (``level``, ``key``, ``retryable``),
and none shadows a builtin: ``ConfigError`` *is* a ``ValueError`` so generic validation
code still catches it, but it is also a ``CacheError``. A miss is a return value, never an
exception.
"""
from __future__ import annotations

from typing import Any

__all__ = [
    "CacheError",
    "ConfigError",
    "SerializationError",
    "LevelUnavailableError",
    "CapacityError",
    "IntegrityError",
]


class CacheError(Exception):
    """Root of every error raised by mlcache."""

    retryable: bool = False

    def __init__(self, message: str, *, level: str | None = None, key: Any = None) -> None:
        super().__init__(message)
        self.level = level
        self.key = key


class ConfigError(CacheError, ValueError):
    """A configuration value is invalid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class SerializationError(CacheError, TypeError):
    """A value could not be encoded (or decoded); names the key and the value's type."""

    def __init__(self, message: str, *, key: Any = None, value_type: type | None = None,
                 level: str | None = None) -> None:
        super().__init__(message, level=level, key=key)
        self.value_type = value_type


class LevelUnavailableError(CacheError):
    """A storage level could not be reached (Redis down, disk unmounted). Retryable."""

    retryable = True


class CapacityError(CacheError):
    """A level that may not drop data (the store of record) has no room left."""


class IntegrityError(CacheError):
    """Stored bytes failed their signature check or could not be decoded."""
