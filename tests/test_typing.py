"""STYLE point 11: the public packages type-check clean under mypy (the settings in
pyproject.toml), so a change that breaks an annotation fails here rather than in a user's IDE."""
from __future__ import annotations

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_reports_no_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out, err, status = api.run(["--cache-dir", str(tmp_path / "mypy-cache"),
                                "mlcache", "policies", "structures", "integrations"])
    assert status == 0, out + err
