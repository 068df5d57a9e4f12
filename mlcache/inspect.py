"""``mlcache inspect CONFIG``: what each level of a configuration holds, per namespace.

CONFIG is a JSON file in the shape of :meth:`CacheConfig.from_dict`. Every byte level below the
heap is opened and scanned; keys are grouped by their namespace (the part of the canonical key
before ``\\x1f``, see :mod:`mlcache.keys`: ``default``, ``default/orders``, ...) and the entries
and bytes (key + encoded value) of each group are counted. Values are read in batches to weigh
them, so inspecting a large level reads it all; ``--keys-only`` skips the values.

The heap and an arena live inside the process that owns them, and an ``"embedded"`` Redis is
private to its process too: a separate ``mlcache inspect`` cannot see them, so they are listed
as such instead of being reported empty. Use ``manager.stats()`` (or ``mlcache stats`` against a
running exporter) for those.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from .config import (ArenaConfig, CacheConfig, DiskConfig, LevelConfig, RedisConfig,
                     redacted_url)
from .keys import SEP

__all__ = ["NamespaceUsage", "LevelUsage", "inspect_config", "format_usage", "main"]

_BATCH = 500


@dataclass
class NamespaceUsage:
    namespace: str
    entries: int = 0
    key_bytes: int = 0
    value_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.key_bytes + self.value_bytes


@dataclass
class LevelUsage:
    level: str
    where: str
    status: str = "ok"          # ok | missing | not visible from another process | error: ...
    namespaces: list[NamespaceUsage] = field(default_factory=list)

    @property
    def entries(self) -> int:
        return sum(n.entries for n in self.namespaces)

    @property
    def bytes(self) -> int:
        return sum(n.bytes for n in self.namespaces)

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "where": self.where, "status": self.status,
                "entries": self.entries, "bytes": self.bytes,
                "namespaces": [{**asdict(n), "bytes": n.bytes} for n in self.namespaces]}


def _namespace_of(key: bytes) -> str:
    ns, sep, _ = key.partition(SEP)
    if not sep:
        return "(no namespace)"
    return ns.decode("utf-8", "backslashreplace")


def _batches(keys: Iterator[bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for k in keys:
        batch.append(k)
        if len(batch) >= _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _where(cfg: LevelConfig) -> str:
    if isinstance(cfg, DiskConfig):
        return cfg.resolved_path()
    if isinstance(cfg, RedisConfig):
        return f"{redacted_url(cfg.url)} prefix={cfg.prefix!r}"
    return cfg.kind


def _holds_disk_level(path: str) -> bool:
    """A database of one cache, or of a shard, is in ``path`` (opening one would create it)."""
    from diskcache.core import DBNAME

    if not os.path.isdir(path):
        return False
    entries = os.listdir(path)
    return DBNAME in entries or any(
        len(e) == 3 and e.isdigit() and os.path.isfile(os.path.join(path, e, DBNAME))
        for e in entries)


def inspect_level(cfg: LevelConfig, *, values: bool = True) -> LevelUsage:
    """Scan one byte level and count its entries and bytes per namespace."""
    usage = LevelUsage(level=cfg.kind, where=_where(cfg))
    if isinstance(cfg, ArenaConfig) or (isinstance(cfg, RedisConfig) and cfg.url == "embedded"):
        usage.status = "in-process only: not visible from another process"
        return usage
    if isinstance(cfg, DiskConfig) and not _holds_disk_level(cfg.resolved_path()):
        if os.path.exists(cfg.resolved_path()) and not os.path.isdir(cfg.resolved_path()):
            # (reported as missing, exit status 0, though no level can open there)
            usage.status = "error: not a directory (a disk level's path is one)"
            return usage
        usage.status = "missing (nothing was ever written there)"
        return usage
    try:
        # Opened unbounded: a bounded level stamps recency on every read, and reading all of it
        # here would reorder its eviction candidates (the bound plays no part in looking).
        level = dataclasses.replace(cfg, max_bytes=None).build()
    except Exception as exc:  # report and go on with the other levels
        usage.status = f"error: {exc}"
        return usage
    groups: dict[str, NamespaceUsage] = {}
    try:
        for batch in _batches(level.scan(b"")):
            sizes = level.get_many(batch) if values else [None] * len(batch)
            for key, data in zip(batch, sizes):
                ns = groups.get(_namespace_of(key))
                if ns is None:
                    ns = groups[_namespace_of(key)] = NamespaceUsage(_namespace_of(key))
                if values and data is None:
                    continue  # deleted between the scan and the read
                ns.entries += 1
                ns.key_bytes += len(key)
                ns.value_bytes += len(data) if data is not None else 0
    except Exception as exc:
        usage.status = f"error: {exc}"
    finally:
        level.close()
    usage.namespaces = sorted(groups.values(), key=lambda n: n.namespace)
    return usage


def inspect_config(config: CacheConfig, *, values: bool = True) -> list[LevelUsage]:
    """One :class:`LevelUsage` per level of ``config``, the heap first (always per process)."""
    out: list[LevelUsage] = []
    if config.heap is not None:
        out.append(LevelUsage(level="heap", where=f"policy {config.heap.policy}",
                              status="in-process only: not visible from another process"))
    out += [inspect_level(cfg, values=values) for cfg in config.levels]
    return out


def _fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def format_usage(usages: list[LevelUsage], *, values: bool = True) -> str:
    lines: list[str] = []
    for u in usages:
        head = f"{u.level}  ({u.where})"
        if u.status != "ok":
            lines += [head, f"  {u.status}", ""]
            continue
        size = f", {_fmt_bytes(u.bytes)}" if values else ""
        lines.append(f"{head}: {u.entries:,} entries{size}")
        if u.namespaces:
            width = max(len("namespace"), *(len(n.namespace) for n in u.namespaces))
            lines.append(f"  {'namespace'.ljust(width)}  {'entries':>10}" +
                         (f"  {'bytes':>10}" if values else ""))
            for n in u.namespaces:
                lines.append(f"  {n.namespace.ljust(width)}  {n.entries:>10,}" +
                             (f"  {_fmt_bytes(n.bytes):>10}" if values else ""))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def load_config(path: str) -> CacheConfig:
    with open(path) as fh:
        return CacheConfig.from_dict(json.load(fh))


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """``mlcache inspect CONFIG [--json] [--keys-only]``."""
    if not isinstance(args, argparse.Namespace):
        parser = argparse.ArgumentParser(prog="mlcache inspect")
        parser.add_argument("config")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--keys-only", action="store_true")
        args = parser.parse_args(args)
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as exc:
        print(f"mlcache inspect: {args.config}: {exc}", file=sys.stderr)
        return 2
    values = not getattr(args, "keys_only", False)
    usages = inspect_config(config, values=values)
    if getattr(args, "json", False):
        print(json.dumps([u.to_dict() for u in usages], indent=2))
    else:
        print(format_usage(usages, values=values), end="")
    return 1 if any(u.status.startswith("error") for u in usages) else 0
