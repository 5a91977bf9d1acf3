"""Render the HTML report of a log and screenshot it in headless Chromium, to look at it as a
user would (the README names this script; it is not a test and needs a Chromium).

    python tests/screenshot_html.py [LOG] [--out report.png] [--width 1280] [-- ANALYZE FLAGS...]

LOG defaults to examples/chat_logs.jsonl; the HTML is written next to the PNG. Chromium is found
as ``chromium``, ``chromium-browser`` or ``google-chrome`` on PATH (``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", nargs="?", default=str(ROOT / "examples" / "chat_logs.jsonl"))
    parser.add_argument("--out", default="report.png", help="the screenshot (PNG)")
    parser.add_argument("--width", type=int, default=1280, help="window width in pixels")
    parser.add_argument("--height", type=int, default=7000, help="window height in pixels")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    flags = argv[split + 1 :]  # more analyze flags, after --
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    if browser is None:
        print("no Chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    png = Path(args.out).resolve()
    html = png.with_suffix(".html")
    command = [sys.executable, "-c", "from cli.entry import main; main()", "analyze", args.log]
    analyzed = subprocess.run([*command, "--html", str(html), "--quiet", *flags], cwd=ROOT)
    if analyzed.returncode not in (0, 1):  # 1: a gate failed, the report is written
        return analyzed.returncode
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={args.width},{args.height}",
                f"--screenshot={png}",
                html.as_uri(),
            ],
            check=True,
            capture_output=True,
        )
    print(f"{html}\n{png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
