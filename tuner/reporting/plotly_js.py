"""The plotly.js the report inlines (once) and the dashboard serves: plotly's own "basic" partial bundle, which has
every trace type our figures and optuna's timeline and history draw (scatter, bar), vendored from the npm registry
at the version the installed plotly package draws for (scripts/vendor-plotly.sh): 1.2 MB where the package's full
bundle is 4.8 MB. Where the installed plotly draws for another plotly.js version the full bundle of the package is
used: a larger page, never a figure drawn by a version it was not made for. No network either way."""

from __future__ import annotations

import functools
import re
from importlib import resources

BASIC = "static/plotly-basic.min.js"
_VERSION = re.compile(r"plotly\.js \(basic - minified\) v(\d+\.\d+\.\d+)")


def basic_bundle() -> tuple[str | None, str]:
    """(the vendored basic bundle's version, its text)."""
    text = resources.files("tuner.reporting").joinpath(BASIC).read_text(encoding="utf-8")
    found = _VERSION.search(text[:400])
    return (found.group(1) if found else None), text


@functools.lru_cache(maxsize=1)
def plotly_script() -> str:
    """The plotly.js source to inline or serve: the basic bundle when it is the installed plotly's version, else the
    installed plotly's full bundle."""
    import plotly.offline

    version, text = basic_bundle()
    if version == plotly.offline.get_plotlyjs_version():
        return text
    return str(plotly.offline.get_plotlyjs())


__all__ = ["basic_bundle", "plotly_script"]
