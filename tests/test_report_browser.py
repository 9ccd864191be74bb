"""The HTML report in a real headless browser (Debian's chromium): the page loads, its plots
are images that load, and its trials table lists every trial of the ledger."""

import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from infrarsi.core.ledger import Ledger

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; "
                                                        ".ci/run installs it where apt-get is available)")
# Appended to a copy of the report next to it: after the page's load event it writes, for
# each image, whether the browser decoded it, into the DOM that --dump-dom prints.
PROBE = """<script>window.addEventListener("load", () => {
  const out = document.createElement("pre"); out.id = "probe";
  out.textContent = Array.from(document.images).map(i => `${i.getAttribute("src")} ${i.complete} ${i.naturalWidth}`).join("\\n");
  document.body.appendChild(out);
});</script>"""


class _Tables(HTMLParser):
    """Rows of the section with id ``trials`` and the probe's text."""

    def __init__(self):
        super().__init__()
        self.section, self.rows, self.probe, self._cell, self._in_probe = None, [], "", None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs.get("id")
        elif tag == "tr" and self.section == "trials":
            self.rows.append([])
        elif tag == "td" and self.section == "trials":
            self._cell = ""
        elif tag == "pre" and attrs.get("id") == "probe":
            self._in_probe = True

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1].append(self._cell)
            self._cell = None
        elif tag == "pre":
            self._in_probe = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._in_probe:
            self.probe += data


@pytest.fixture(scope="module")
def campaign_dir(staged_campaigns):
    return staged_campaigns[1][0]


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                           "--virtual-time-budget=5000", *args], capture_output=True, text=True, timeout=120)


def test_the_report_loads_with_its_plots_and_every_trial(campaign_dir, tmp_path):
    page = campaign_dir.report_html
    probe = page.with_name("report-probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium("--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-3000:]
    parsed = _Tables()
    parsed.feed(dom.stdout)

    images = [line.split() for line in parsed.probe.strip().splitlines()]
    assert sorted(src for src, _, _ in images) == ["plots/best_so_far.png", "plots/time_vs_memory.png"]
    assert all(complete == "true" and int(width) > 0 for _, complete, width in images), images

    trials = Ledger(campaign_dir.ledger).trials()
    assert len(parsed.rows) == len(trials) + 1  # the header row has no <td>
    listed = [row[0] for row in parsed.rows if row]
    assert listed == [t.trial_id + (f"#{t.attempt}" if t.attempt > 1 else "") for t in trials]
    assert {row[2] for row in parsed.rows if row} == {t.outcome.value for t in trials}

    shot = tmp_path / "report.png"
    out = _chromium(f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri())
    assert out.returncode == 0 and shot.stat().st_size > 10_000, out.stderr[-3000:]
    assert re.search(r"<h1>infrarsi campaign <code>sim-dense-", dom.stdout)
