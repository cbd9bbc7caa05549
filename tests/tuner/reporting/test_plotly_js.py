"""The plotly.js the report inlines and the dashboard serves (tuner.reporting.plotly_js): the vendored basic bundle at
the version the installed plotly draws for. After a plotly upgrade this fails until scripts/vendor-plotly.sh is run
(the report then falls back to the package's full bundle: correct, 4.8 MB)."""

from __future__ import annotations

import plotly.offline

from tuner.reporting.plotly_js import basic_bundle, plotly_script


def test_the_basic_bundle_is_the_installed_plotly_version_and_is_served() -> None:
    version, text = basic_bundle()
    assert version == plotly.offline.get_plotlyjs_version(), "run scripts/vendor-plotly.sh"
    assert plotly_script() == text and len(text) < 1_300_000
