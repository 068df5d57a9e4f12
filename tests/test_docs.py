"""Every ```python block in docs/ (and the README's quick start) runs here.

Blocks of one page share a namespace and run in order, in a fresh temporary working directory
with MLCACHE_HOME pointing into it, so a page reads like one session. A block whose info string
is ``python skip-test`` is not run (use only for shell-like fragments that cannot run here).
"""
from __future__ import annotations

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def _blocks(path: pathlib.Path) -> list[str]:
    return [code for info, code in BLOCK.findall(path.read_text()) if "skip-test" not in info]


PAGES_WITH_CODE = [p for p in PAGES if p.exists() and _blocks(p)]


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_code_runs(page, tmp_path, monkeypatch, redis_server, request):
    if any("pyspark" in code for code in _blocks(page)):
        # the page's SparkSession.builder...getOrCreate() then returns the suite's one session
        # (made once, with the test settings: no UI, 4 shuffle partitions) instead of starting
        # one with Spark's defaults
        request.getfixturevalue("spark")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLCACHE_HOME", str(tmp_path / "mlcache-home"))
    monkeypatch.setenv("MLCACHE_TEST_REDIS_URL", redis_server.url)
    namespace: dict = {"__name__": "__docs__"}
    for i, code in enumerate(_blocks(page)):
        try:
            exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # name the page and block in the failure
            raise AssertionError(f"{page.relative_to(ROOT)} block {i} failed: {exc!r}") from exc
    closer = namespace.get("__docs_cleanup__")
    if callable(closer):
        closer()
