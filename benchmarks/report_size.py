"""The size of `tuner report`'s page for a 50-probe study (issue 40 §5: under 1.5 MB; 4.97 MB before, for about
22 KB of content): the report study of the tests (tests/helpers/report_study.py: 48 trials over micro batch x length x
ZeRO stage, two OOMs, a confirm probe, an error, three ruled-out configs) written to a temporary SQLite file, its
report rendered, and the page's bytes split into plotly.js, the figures' scripts and the rest.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/report_size.py
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from tests.helpers.report_study import populate_study
from tuner.reporting.html import write_report


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'size.db'}"
        expected = populate_study(url, "size")
        page = write_report(url, "size", Path(tmp) / "report.html").read_text()
    scripts = [len(s) for s in re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)]
    library = max(scripts)
    print(f"probe rows: {expected['probes']}")
    print(f"page: {len(page.encode()):,} bytes")
    figures, rest = sum(scripts) - library, len(page) - sum(scripts)
    print(f"  plotly.js: {library:,}; figures' scripts: {figures:,}; the rest: {rest:,}")


if __name__ == "__main__":
    main()
