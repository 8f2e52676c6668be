"""The HTML report opens with its headline and every chart draws, with legends that fit, in headless Chromium.

Chromium (Debian's `chromium`) is a test dependency: `.ci/run` installs it, and without it this test fails
rather than skips, so CI can never pass without having rendered the report.
"""

import json
import re
import shutil
import subprocess

from typer.testing import CliRunner

from mkb.cli.analyze import app

runner = CliRunner()
CHARTS = {"lift_by_model", "problem_slopes", "lift_vs_standing", "family_heatmap"}


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed\nhint: apt-get install -y chromium (.ci/run does this before the tests)"
    return exe


def test_report_headline_and_every_chart_draws_in_headless_chromium(planted_lift, tmp_path):
    exe = _chromium()
    out = tmp_path / "rep"
    r = runner.invoke(app, ["report", "--store", planted_lift.store, "--out", str(out), "--resamples", "300"])
    assert r.exit_code == 0, r.output
    html = (out / "report.html").read_text()
    head = html[html.index("<section id='headline'>"):html.index("</section>")]
    assert html.index("<section id='headline'>") < html.index("<h2>Lift table</h2>")  # the report opens with it
    assert "relative lift vs solo" in head and "noise floor" in head and "time-matched" in head
    assert "Standing effect of the transfer arm" in head and ("cannot detect" in head or "at least 80% power" in head)
    assert re.search(r"<b>\+\d+\.\d%</b> \[\+\d+\.\d%, \+\d+\.\d%\]", head)  # a cell's relative lift with its CI
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,2000",
                          "--virtual-time-budget=30000", "--dump-dom", (out / "report.html").as_uri()],
                         capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="render-status"[^>]*>([^<]+)</pre>', dom.stdout)
    assert m, f"the render check never completed\n{dom.stderr[-2000:]}"
    status = json.loads(m.group(1).replace("&quot;", '"'))
    assert set(status) == CHARTS
    for name, s in status.items():
        assert s["drawn"] and s["marks"] > 0, (name, s)
        assert s["legends"] >= 1 and s["legends_fit"], (name, s)
        assert s["fits_page"], (name, s)
