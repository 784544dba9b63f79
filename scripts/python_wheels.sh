#!/usr/bin/env bash
# Downloads the wheels the Python package's build needs (pyproject.toml's build requirements and
# theirs: all pure Python, so one set serves any interpreter) into DIR, for machines that cannot
# reach PyPI, such as the GPU machines the device tool lends:
#
#   scripts/python_wheels.sh build/wheels            # here, with network
#   OPFUSE_WHEELS=build/wheels bench/run_gpu.sh       # there (bench/run_gpu.sh installs from it)
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=build/wheels tests/python/run_package_tests.sh install WORK
set -euo pipefail
dir=${1:?usage: scripts/python_wheels.sh DIR}
cd "$(dirname "$0")/.."
mkdir -p "$dir"
python=${PYTHON:-python3}
mapfile -t requires < <("$python" scripts/build_requirements.py pyproject.toml)
"$python" -m pip download -q --only-binary=:all: --dest "$dir" "${requires[@]}"
# Every wheel must be pure Python: the GPU machines' interpreter may not be this one.
names=()
for wheel in "$dir"/*.whl; do
  name=$(basename "$wheel")
  if [[ $name != *-py3-none-any.whl ]]; then
    echo "scripts/python_wheels.sh: $name is not pure Python" >&2
    exit 1
  fi
  names+=("$name")
done
echo "${#names[@]} wheels in $dir: ${names[*]}"
