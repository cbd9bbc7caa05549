#!/usr/bin/env bash
# Builds the wheel kit for benchmarks/gpu_check.sh on a bare GPU machine, into .whl/ (ignored by git). The check's
# driver (benchmarks/gpu/check.py: the standard library and the device's own pip until then) installs it into a
# temporary site folder as its first step ("kit", boxed 30 s) and puts that folder on every later step's path; carry
# .whl to the device with the tree (together at most the device tool's 64 MiB a call).
#
#   benchmarks/gpu/kit.sh            # here, with network (PyPI); one command
#
# The device machine has python3 3.12 with torch, transformers, accelerate, peft, typer, rich, pyyaml, httpx,
# psutil (and their dependencies: numpy, packaging, tqdm, typing-extensions, jinja2/MarkupSafe, anyio, idna ...) and
# no network. The kit holds exactly what it lacks, at the versions this project's venv runs (so the check runs what
# the tests ran): cp312 manylinux x86_64 wheels from PyPI, and DeepSpeed built here from its sdist (no wheel on PyPI)
# with no op prebuilt (DS_BUILD_OPS=0: ops are JIT-compiled on the device, as `tuner prepare` does).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${KIT_DIR:-.whl}
LIMIT_MIB=${KIT_LIMIT_MIB:-40}
# what the check imports that the device lacks: DeepSpeed, Optuna, SQLAlchemy, alembic, pydantic, pydantic-settings
# and their dependencies, minus what the device has. typing-extensions too: pydantic 2.14 needs >= 4.16 and the
# device's version is unknown (a newer one in the kit's site folder comes first on the path). Not the API server's
# (FastAPI, starlette, opentelemetry, importlib-metadata, zipp): the check never imports them.
PACKAGES=(
  optuna alembic colorlog sqlalchemy mako
  pydantic pydantic-core annotated-types typing-inspection typing-extensions pydantic-settings python-dotenv
  hjson py-cpuinfo msgpack einops  # the device has ninja (DeepSpeed's JIT ops build with it)
)
DEEPSPEED=deepspeed==$("$PY" -c "from importlib.metadata import version; print(version('deepspeed'))")

pins=()
for name in "${PACKAGES[@]}"; do
  v=$("$PY" -c "import sys; from importlib.metadata import version; print(version(sys.argv[1]))" "$name" 2>/dev/null || true)
  pins+=("$name${v:+==$v}")
done

rm -rf "$OUT" && mkdir -p "$OUT"
echo "== kit: ${#pins[@]} wheels for cp312 manylinux x86_64 + $DEEPSPEED from its sdist -> $OUT/"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$OUT" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  "${pins[@]}"

build=$(mktemp -d /tmp/kit-build.XXXXXX)
trap 'rm -rf "$build"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary=:all: --no-build-isolation --dest "$build" "$DEEPSPEED"
# the sdist's setup.py imports torch: build with this venv's (no isolation); no op is compiled
DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$OUT" "$build"/deepspeed-*.tar.gz

ls -1 "$OUT"
size=$(du -sb "$OUT" | cut -f1)
echo "kit: $(ls "$OUT" | wc -l) wheels, $((size / 1024)) KiB in $OUT/"
if [ "$size" -gt $((LIMIT_MIB * 1024 * 1024)) ]; then
  echo "kit: over the ${LIMIT_MIB} MiB limit" >&2
  exit 1
fi
