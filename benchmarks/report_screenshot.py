"""The first screen of a campaign's report as a user sees it: headless Chromium renders
``report.html`` at 1300 x 900 and writes a PNG.

    python benchmarks/report_screenshot.py CAMPAIGN_DIR [--out first_screen.png] [--width 1300 --height 900]

The report is rebuilt from the folder first (``infrarsi report DIR``'s build) unless
``--no-rebuild``. Needs ``chromium`` (Debian: ``apt-get install chromium``) on PATH.
tests/test_report_browser.py drives the same browser through ``chromium_command``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

FIRST_SCREEN = (1300, 900)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium_command(*args: str, width: int = FIRST_SCREEN[0], height: int = FIRST_SCREEN[1]) -> list[str]:
    """Headless Chromium at a window of ``width`` x ``height`` that may read local files."""
    browser = chromium()
    if browser is None:
        raise SystemExit("no chromium on PATH: install it (Debian: apt-get install --no-install-recommends chromium)")
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--allow-file-access-from-files", "--virtual-time-budget=5000", f"--window-size={width},{height}", *args]


def first_screen(report_html: Path, out_png: Path, *, width: int = FIRST_SCREEN[0],
                 height: int = FIRST_SCREEN[1]) -> Path:
    """Write the top ``width`` x ``height`` of the page to ``out_png``."""
    out_png.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(chromium_command(f"--screenshot={out_png.resolve()}", Path(report_html).resolve().as_uri(),
                                           width=width, height=height),
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not out_png.exists():
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    return out_png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("campaign_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: first_screen.png in the folder)")
    parser.add_argument("--width", type=int, default=FIRST_SCREEN[0])
    parser.add_argument("--height", type=int, default=FIRST_SCREEN[1])
    parser.add_argument("--no-rebuild", action="store_true", help="screenshot report.html as it is")
    args = parser.parse_args(argv)
    if not args.no_rebuild:
        from infrarsi.stages.report.report import build_report

        build_report(args.campaign_dir)
    out = first_screen(args.campaign_dir / "report.html", args.out or args.campaign_dir / "first_screen.png",
                       width=args.width, height=args.height)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
