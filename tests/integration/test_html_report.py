"""``--report FILE``: one self-contained page of SVG charts, written through the guard, drawn
in a real headless Chromium (Debian's package) without errors; an ``.svg`` picture written by
Python alone, a ``.png`` drawn by that browser and refused in one line where there is none."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]
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
    assert text.count('<div class="chart">') == 4  # by global_step, group means, rewards, group sizes
    assert text.count('<svg class="chart-svg"') == 8  # each drawn for a laptop and for a phone
    assert len(text.encode()) < 100_000  # no plotting library embedded
    assert "By global_step: inactive groups and mean reward" in text
    assert "Read as a ROLL dump" in text


def test_the_report_goes_through_the_guard(cli: Any, tmp_path: Path) -> None:
    page = written_report(cli, tmp_path)
    assert_one_line_error(cli("check", ROLL, "--from", "roll", "--report", page), "already exists")
    assert_one_line_error(
        cli("check", ROLL, "--from", "roll", "--report", tmp_path / "r.pdf"), "an .html file", ".png or .svg"
    )
    inside = ROLL / "report.html"
    assert_one_line_error(cli("check", ROLL, "--from", "roll", "--report", inside), "input directory")
    assert not inside.exists()
    out = tmp_path / "out.parquet"
    both = cli("compute", ROLL, "--from", "roll", "-o", out, "--report", out)
    assert both.exit_code == 2 and not out.exists()


def test_ray_checks_the_report_path_before_any_work(cli: Any, tmp_path: Path) -> None:
    """--engine ray draws the report too (test_ray.py compares its page with the local
    engine's); a path it cannot write is refused before Ray starts, and nothing is written."""
    result = cli(
        "compute",
        ROLL,
        "--from",
        "roll",
        "-o",
        tmp_path / "o",
        "--engine",
        "ray",
        "--report",
        tmp_path / "r.pdf",
    )
    assert_one_line_error(result, "an .html file", ".png or .svg")
    assert not list(tmp_path.iterdir())


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
    assert dom.stdout.count('class="chart-svg"') == 8  # each chart, for a laptop and a phone
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    subprocess.run(
        [*args, "--window-size=1200,1500", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 20_000  # drawn, not a blank page


HAS_BROWSER = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="Debian's chromium is not installed (make browser)"
)


def picture(cli: Any, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``--report name`` on the ROLL dump, with HOME pointed at an empty folder (the browser
    must not write there) and a TMPDIR of its own, too long for the browser's socket paths
    (Chromium aborted under one of 63 characters or more): the run takes /tmp for the browser,
    and leaves nothing in either (only this process's folders are looked for in /tmp, where a
    suite beside this one has its own)."""
    import tempfile

    home = tmp_path / "home"
    home.mkdir()
    scratch = tmp_path / ("tmp" + "x" * 60)
    scratch.mkdir()
    ours = f"grpo-cli-spool-{os.getpid()}-*"
    before = set(Path("/tmp").glob(ours))
    path = tmp_path / name
    with monkeypatch.context() as run:
        run.setenv("HOME", str(home))
        run.setenv("TMPDIR", str(scratch))
        run.setattr(tempfile, "tempdir", str(scratch))
        result = cli("check", ROLL, "--from", "roll", "--by", "global_step", "--report", path)
    assert result.exit_code == 0, result.stderr
    assert list(home.iterdir()) == []
    assert list(scratch.iterdir()) == []
    assert set(Path("/tmp").glob(ours)) == before
    return path


@HAS_BROWSER
def test_a_png_report_is_the_page_drawn_by_the_browser(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import struct
    import zlib

    data = picture(cli, tmp_path, "report.png", monkeypatch).read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    assert width == 1100 and height > 3 * 300  # the title, the verdict and three charts
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        if data[at + 4 : at + 8] == b"IDAT":
            chunks.append(data[at + 8 : at + 8 + length])
        at += 12 + length
    pixels = zlib.decompress(b"".join(chunks))
    assert len(set(pixels[: len(pixels) // 2])) > 50  # charts drawn, not one blank colour


def test_an_svg_report_is_every_chart_in_one_document_written_without_a_browser(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import xml.etree.ElementTree as ET

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path = picture(cli, tmp_path, "report.svg", monkeypatch)
    root = ET.parse(path).getroot()
    svg = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{svg}svg"
    charts = root.findall(f"{svg}svg")
    assert len(charts) == 4  # by global_step, group means, rewards, group sizes
    tops = [float(chart.attrib["y"]) for chart in charts]
    assert tops == sorted(tops) and float(root.attrib["height"]) > tops[-1]
    text = path.read_text()
    assert "By global_step: inactive groups and mean reward" in text
    assert "grpo-cli report:" in text and "groups" in text and "No checks asked" in text
    if shutil.which("chromium") is None:
        return
    shot = tmp_path / "svg.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", path.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 20_000  # a browser draws the SVG


def test_a_png_without_a_browser_is_refused_before_any_work(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "out.parquet"
    result = cli("compute", ROLL, "--from", "roll", "-o", out, "--report", tmp_path / "r.png")
    assert_one_line_error(result, "headless Chromium", "apt-get install chromium", ".html file or an .svg")
    assert not out.exists() and not (tmp_path / "r.png").exists()


def test_a_browser_that_fails_is_one_line_and_writes_no_picture(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "chromium"
    fake.write_text("#!/bin/sh\necho 'cannot open display' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    result = cli("check", ROLL, "--from", "roll", "--report", tmp_path / "r.png")
    assert_one_line_error(result, "could not draw the picture", "exit 3: cannot open display")
    assert not (tmp_path / "r.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


def test_the_browsers_folder_fits_its_socket_paths_and_goes_on_every_exit(tmp_path, monkeypatch):
    """Chromium aborts (leaving its socket folder) where TMPDIR + 45 bytes passes the 107 a socket
    path holds: its private folder is made in TMPDIR where that fits, else in /tmp, and removed
    whether the drawing worked or failed."""
    import tempfile

    from grpo_cli.results import html_report
    from grpo_cli.scratch import SCRATCH_NAME_BYTES, SOCKET_PATH_BYTES

    short = tmp_path / "t"
    short.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    with html_report._browser_folder() as folder:
        assert folder.parent == Path("/tmp")
        assert len(str(folder)) + html_report.BROWSER_SOCKET_TAIL <= SOCKET_PATH_BYTES
        assert len(str(folder)) <= len("/tmp") + SCRATCH_NAME_BYTES
    assert not folder.exists()

    long = tmp_path / ("x" * (SOCKET_PATH_BYTES - html_report.BROWSER_SOCKET_TAIL))
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    made: list[Path] = []

    def failing_draw() -> None:
        with html_report._browser_folder() as folder:
            made.append(folder)
            (folder / "org.chromium.Chromium.abcdef").mkdir()
            raise RuntimeError("the browser failed")

    with pytest.raises(RuntimeError):
        failing_draw()
    assert made[0].parent == Path("/tmp")
    assert not made[0].exists()
    assert list(long.iterdir()) == []


NEMO = ROOT / "sample_data" / "dumps" / "nemo-rl"


def test_the_page_opens_with_the_verdict_the_filter_and_the_counts(cli: Any, tmp_path: Path) -> None:
    """A reviewer reads the answer first: which checks failed (value and bound), what the
    trainer's filter decided, the findings, then the terminal's counts; a phone gets a viewport."""
    page = tmp_path / "report.html"
    args = [
        "--trainer-filter",
        "nemo-rl",
        "--max-inactive-fraction",
        "0.4",
        "--max-misclassified-groups",
        "0",
    ]
    result = cli("check", NEMO, "--from", "nemo-rl", *args, "--report", page)
    assert result.exit_code == 1, result.stderr
    text = page.read_text()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in text
    verdict = text.index('<section id="verdict">')
    assert verdict < text.index('<table id="counts">') < text.index('class="chart"')
    assert '<p class="verdict fail">FAIL: 1 of 2 checks failed</p>' in text
    assert "<td><b>FAIL</b></td><td>max-inactive-fraction</td>" in text
    assert "<td>PASS</td><td>max-misclassified-groups (nemo-rl)</td>" in text
    assert "keeps 249 of 441 groups; 0 kept although constant, 0 dropped although active, 88 split" in text
    assert "39 of 441 groups have 2 or more times the 4 rows" in text  # the merged-groups finding
    for label, value in (("groups", "441"), ("active groups", "249 (56.5%)"), ("inactive, all 0.0", "108")):
        assert f'<td>{label}</td><td class="n">{value}</td>' in text


def test_a_page_without_checks_says_so(cli: Any, tmp_path: Path) -> None:
    text = written_report(cli, tmp_path).read_text()
    assert '<p class="verdict none">No checks asked' in text and 'class="checks"' not in text


def _gallery() -> Any:
    """docs/gen_dump_examples.py, whose ``GALLERY`` names the reports a reviewer opens (it draws
    them into docs/reports/): the tests render the same ones."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_dump_examples", ROOT / "docs" / "gen_dump_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GALLERY = _gallery()


_MEASURE = (
    "<script>window.addEventListener('load', () => setTimeout(() => {"
    " const charts = Array.from(document.querySelectorAll('svg.chart-svg'))"
    ".map(s => s.getBoundingClientRect().width);"
    " const out = document.createElement('pre'); out.id = 'measured';"
    " out.textContent = JSON.stringify({body: document.body.clientWidth, scroll: document.body.scrollWidth,"
    " widest: Math.max(0, ...charts)}); document.body.appendChild(out); }, 500));</script>"
)


@HAS_BROWSER
@pytest.mark.slow
@pytest.mark.parametrize("width", [390, 1400])
@pytest.mark.parametrize("report", list(GALLERY.GALLERY))
def test_every_report_fits_a_phone_and_a_laptop_with_its_verdict_and_counts(
    cli: Any, tmp_path: Path, report: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headless Chromium's window is never under 500 px, so a phone's 390 is the page's own
    width; each chart is drawn within it, nothing is wider than the page, the verdict and the
    counts are in the DOM, and the console stays quiet."""
    import json

    page = tmp_path / "report.html"
    monkeypatch.chdir(ROOT)  # the gallery's paths are the repo's
    result = cli(*GALLERY.gallery_arguments(report, tmp_path), "--report", page, "-q")
    assert result.exit_code in (0, 1), result.stderr
    measured = tmp_path / "measured.html"
    text = page.read_text()
    measured.write_text(
        text.replace("<head>", f"<head><style>html{{width:{width}px}}</style>", 1).replace(
            "</body></html>", _MEASURE + "</body></html>", 1
        )
    )
    args = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000"]
    dom = subprocess.run(
        [
            *args,
            f"--window-size={max(width, 500)},1200",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            measured.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    assert 'id="verdict"' in dom.stdout and 'id="counts"' in dom.stdout
    found = re.search(r'<pre id="measured">([^<]*)</pre>', dom.stdout)
    assert found is not None, dom.stdout[-2000:]
    sizes = json.loads(found.group(1))
    assert sizes["body"] == min(width - 32, 1100)  # the margins; at most 1,100 px of text
    assert 0 < sizes["widest"] <= sizes["body"] and sizes["scroll"] <= sizes["body"], sizes


def _by_values(keys: list[Any], inactive: Any) -> list[dict[str, Any]]:
    return [
        {
            "value": key,
            "groups": 10,
            "rows": 80,
            "inactive_groups": inactive(i),
            "inactive": {"all_min": inactive(i), "all_max": 0, "other": 0},
            "reward_mean": 0.25,
        }
        for i, key in enumerate(keys)
    ]


def test_a_text_columns_values_are_bars_ranked_worst_first_with_the_rest_summed() -> None:
    from grpo_cli.results.html_report import PHONE_WIDTH, SHOWN_CATEGORIES, _by_chart

    values = _by_values([f"source_{i:02d}" for i in range(40)], lambda i: i % 7)
    chart = _by_chart("data_source", values)
    assert chart.kind == "ranked"
    parts = chart.data["parts"]
    assert [part.name for part in parts] == ["inactive: all at the minimum"]  # no empty series
    labels, shares = chart.data["labels"], list(parts[0].values)
    assert len(labels) == SHOWN_CATEGORIES + 1 and labels[-1] == "25 other values"
    assert shares[:-1] == sorted(shares[:-1], reverse=True) and shares[0] == 0.6
    rest = sorted(values, key=lambda v: -v["inactive_groups"])[SHOWN_CATEGORIES:]
    assert shares[-1] == sum(v["inactive_groups"] for v in rest) / (10 * len(rest))
    assert parts[0].hovers[0] == "source_06: inactive: all at the minimum 60.0% (6 of 10 groups)"
    for width in (1100, PHONE_WIDTH):
        svg = chart.svg(width)
        assert ">0%</text>" in svg and ">0</text>" in svg  # both axes from zero
        assert svg.count("<rect") - svg.count('width="0.0"') >= SHOWN_CATEGORIES  # a bar per row
        assert svg.index(">source_06<") < svg.index(">source_05<")  # drawn in rank order


def test_steps_are_lines_with_whole_number_ticks_on_axes_from_zero() -> None:
    from grpo_cli.results.html_report import _by_chart

    chart = _by_chart("step", _by_values(list(range(300, 0, -1)), lambda i: i % 3))
    assert chart.kind == "ordered" and chart.data["x"] == sorted(chart.data["x"])  # in step order
    svg = chart.svg(1100)
    ticks = re.findall(r'text-anchor="middle"[^>]*>([0-9,.]+)</text>', svg)
    assert ticks and all(tick.isdigit() for tick in ticks), ticks  # whole numbers only
    assert "<circle" not in svg  # no marker on each of 300 points
    assert ">0%</text>" in svg and ">0</text>" in svg  # the shares and the mean from zero
    few = _by_chart("step", _by_values([1, 2, 3], lambda i: 1)).svg(1100)
    assert few.count("<circle") == 3 + 3  # markers on the stack's top and on the mean's line
    assert re.findall(r'text-anchor="middle"[^>]*>([0-9,.]+)</text>', few) == ["1", "2", "3"]


def test_every_rows_reward_is_drawn_at_the_values_it_holds_or_in_ranges(cli: Any, tmp_path: Path) -> None:
    """Binary rewards are two bars, 0 and 1, counting rows; the sample's continuous reward is
    bars of equal width counting every scored row, each hover naming its range."""
    sample = ROOT / "sample_data" / "rollouts.parquet"
    binary, continuous = tmp_path / "binary.html", tmp_path / "continuous.html"
    for page, column in ((binary, "correct"), (continuous, "reward")):
        result = cli("check", sample, "--reward-col", column, "--report", page, "-q")
        assert result.exit_code == 0, result.stderr
    text = binary.read_text()
    assert "<h3>Rewards: rows of each value</h3>" in text
    import pyarrow.parquet as pq

    correct = pq.read_table(sample).column("correct").to_pylist()
    for value in (0, 1):
        assert f"<title>reward {value}: {correct.count(value):,} rows</title>" in text
    text = continuous.read_text()
    assert "<h3>Rewards: rows per range</h3>" in text
    hovers = re.findall(r"<title>reward \[([-0-9.e]+), ([-0-9.e]+)\): ([0-9,]+) rows</title>", text)
    rewards = pq.read_table(sample).column("reward").to_pylist()
    assert len(hovers) % 2 == 0 and hovers[: len(hovers) // 2] == hovers[len(hovers) // 2 :]  # laptop, phone
    shown = hovers[: len(hovers) // 2]
    assert sum(int(n.replace(",", "")) for _, _, n in shown) == len(rewards)
    for low, high, n in shown:
        assert sum(float(low) <= r < float(high) for r in rewards) == int(n.replace(",", "")), (low, high)
