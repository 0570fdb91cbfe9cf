"""``--report FILE.html``: one self-contained page, written through the guard, drawn in a
real headless Chromium (Debian's package) without errors."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
ROLL = ROOT / "sample_data" / "dumps" / "roll"


def written_report(cli: Any, tmp_path: Path, *extra: str) -> Path:
    page = tmp_path / "report.html"
    result = cli("check", ROLL, "--from", "roll", "--by", "global_step", "--report", page, *extra)
    assert result.exit_code == 0, result.stderr
    return page


def test_the_report_is_one_page_that_fetches_nothing(cli: Any, tmp_path: Path) -> None:
    text = written_report(cli, tmp_path).read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<link[^>]+href=", text)
    assert text.count('class="plotly-graph-div"') == 3  # by global_step, group means, group sizes
    assert "Inactive groups and mean reward by global_step" in text
    assert "Read as a ROLL dump" in text


def test_the_report_goes_through_the_guard(cli: Any, tmp_path: Path) -> None:
    page = written_report(cli, tmp_path)
    assert_one_line_error(cli("check", ROLL, "--from", "roll", "--report", page), "already exists")
    assert_one_line_error(
        cli("check", ROLL, "--from", "roll", "--report", tmp_path / "r.png"), "an .html file"
    )
    inside = ROLL / "report.html"
    assert_one_line_error(cli("check", ROLL, "--from", "roll", "--report", inside), "input directory")
    assert not inside.exists()
    out = tmp_path / "out.parquet"
    both = cli("compute", ROLL, "--from", "roll", "-o", out, "--report", out)
    assert both.exit_code == 2 and not out.exists()


def test_ray_refuses_the_report_in_one_line(cli: Any, tmp_path: Path) -> None:
    result = cli("compute", ROLL, "-o", tmp_path / "o", "--engine", "ray", "--report", tmp_path / "r.html")
    assert_one_line_error(result, "--report draws a local run's figures")


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="Debian's chromium is not installed (make browser)"
)
def test_chromium_draws_every_chart_without_an_error(cli: Any, tmp_path: Path) -> None:
    page = written_report(cli, tmp_path)
    args = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000"]
    dom = subprocess.run(
        [*args, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('class="main-svg"') >= 6  # each chart draws two svg layers
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    subprocess.run(
        [*args, "--window-size=1200,1500", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 20_000  # drawn, not a blank page
