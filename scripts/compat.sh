#!/usr/bin/env bash
# The compat job: the declared floors of the user's libraries (pyproject.toml) that install on this machine's CPU torch,
# in a second environment (.venv-compat), running the tests that touch the user's library versions: the exports
# accepted by their tools, the baseline import of their files, the Trainer consuming the export, the seed e2e search.
# The matrix it ran is recorded in docs/COMPAT.md. Network (PyPI) for the first install; later runs reuse the venv.
#
#   scripts/compat.sh                       # the floors below
#   COMPAT_PINS="transformers==4.57.1" scripts/compat.sh   # another row of the matrix
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${COMPAT_VENV:-.venv-compat}
PINS=${COMPAT_PINS:-"transformers==4.46.3 deepspeed==0.15.4 accelerate==1.0.1 optuna==4.0.0"}
TESTS=(
  tests/tuner/interop/test_export_tools.py tests/tuner/interop/test_export_trainer.py
  tests/tuner/interop/test_baseline.py tests/tuner/interop/test_own_files.py
  tests/e2e/test_search_cli.py::test_the_motivating_teams_files_fix_the_job_every_probe_runs
)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip's "Location ... is ignored" lines come from a find-links/index setting of some hosts (as in scripts/install.sh)
pip() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2); }
pip torch==2.13.0 setuptools wheel packaging py-cpuinfo hjson psutil ninja numpy pydantic
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
tr ' ' '\n' <<< "$PINS" > "$constraints"
# DeepSpeed's sdist imports torch in its setup.py: built against the venv's torch, no op prebuilt (JIT, as elsewhere)
DS_BUILD_OPS=0 pip --no-build-isolation -c "$constraints" deepspeed
pip -c "$constraints" -e ".[test]"
"$VENV/bin/python" -c "import importlib.metadata as m; print('compat:', ', '.join(f'{d} {m.version(d)}' for d in ('torch', 'transformers', 'deepspeed', 'accelerate', 'optuna')))"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}" "$@"
