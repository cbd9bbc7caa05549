#!/usr/bin/env bash
# Refreshes tuner/reporting/static/plotly-basic.min.js: plotly.js's "basic" partial bundle (scatter and bar traces,
# every figure the report and the dashboard draw; 1.2 MB against the full bundle's 4.8 MB) from the npm registry,
# at the plotly.js version the installed plotly package draws for (plotly.offline.get_plotlyjs_version()). Run it
# after upgrading plotly; tests/tuner/reporting/test_plotly_js.py fails until the versions agree (the report then
# falls back to the package's full bundle, correct but 4.8 MB). Needs npm.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(.venv/bin/python -c 'import plotly.offline as o; print(o.get_plotlyjs_version())')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "plotly.js-basic-dist-min@${version}" >/dev/null && tar xzf ./*.tgz)
cp "$work/package/plotly-basic.min.js" tuner/reporting/static/plotly-basic.min.js
cp "$work/package/LICENSE" tuner/reporting/static/plotly-basic.LICENSE
echo "vendor-plotly: plotly.js basic bundle ${version} in tuner/reporting/static/"
