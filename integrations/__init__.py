"""Integrations of mlcache with data engines.

Each integration lives in its own subpackage and imports its engine lazily, so importing
``mlcache`` (or this package) never imports Spark. ``mlcache.integrations.spark`` is the
PySpark integration: one manager per Python worker process, partition helpers, coherent and
exactly-once state across worker processes and replayed micro-batches.
"""

__all__: list[str] = []
