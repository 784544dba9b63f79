#!/usr/bin/env bash
# ctest python_package_install / python_package_cpu / python_package_gpu (tests/script_tests.cmake):
#   install WORK  builds the package (pyproject.toml) into a virtual environment under WORK, linked
#                 against this build tree's libraries (OPFUSE_PREBUILT_DIR: only the bindings
#                 compile), and prints how long that took;
#   cpu WORK      runs tests/python/test_package_cpu.py and type-checks the stubs with mypy;
#   gpu WORK      runs tests/python/test_package_gpu.py (skips without a GPU or torch).
# The environment sees the system's packages (--system-site-packages), so torch where installed;
# without Python's venv module the packages go to WORK/site instead.
# Environment: PYTHON, SOURCE_DIR, BUILD_DIR, FUSEC.
set -euo pipefail
mode=$1
work=$2
venv="$work/venv"
site="$work/site"
if [ "$mode" = install ] && [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$work"
  # Without the venv module (Debian's python3-venv missing on a GPU machine): the package goes
  # to WORK/site, on PYTHONPATH.
  "$PYTHON" -m venv --system-site-packages "$venv" || rm -rf "$venv"
  # A venv that does not see the interpreter's torch or NumPy (installed where
  # --system-site-packages does not reach, e.g. the user's site: as on the GPU machines, whose
  # venv saw neither) would test without them: the package goes to WORK/site beside them instead.
  for module in torch numpy; do
    if [ -x "$venv/bin/python" ] && "$PYTHON" -c "import $module" 2>/dev/null &&
      ! "$venv/bin/python" -c "import $module" 2>/dev/null; then
      echo "python_package: the venv does not see $PYTHON's $module; installing into $site"
      rm -rf "$venv"
    fi
  done
fi
if [ -x "$venv/bin/python" ]; then
  py="$venv/bin/python"
  target=()
else
  py="$PYTHON"
  target=(--target "$site" --upgrade)
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export OPFUSE_SOURCE_DIR="$SOURCE_DIR" OPFUSE_TEST_WORK_DIR="$work" FUSEC
export OPFUSE_CACHE_DIR="$work/kernel-cache" MYPY_CACHE_DIR="$work/mypy-cache"
export PIP_DISABLE_PIP_VERSION_CHECK=1

case "$mode" in
install)
  start=$(date +%s)
  # The build requirements as pyproject.toml pins them (one place for their ranges) and NumPy,
  # those the interpreter lacks: a GPU machine has no network, but its Python has them all.
  # Offline without them: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR with their wheels.
  mapfile -t requires < <("$py" "$SOURCE_DIR/scripts/build_requirements.py" --missing \
    "$SOURCE_DIR/pyproject.toml")
  "$py" -c "import numpy" 2>/dev/null || requires+=("numpy>=1.22")
  if [ "${#requires[@]}" -gt 0 ]; then
    "$py" -m pip install -q "${target[@]}" "${requires[@]}"
  fi
  deps=$(date +%s)
  "$py" -m pip install -q "${target[@]}" --no-build-isolation --no-deps --force-reinstall \
    "$SOURCE_DIR" \
    --config-settings=cmake.define.OPFUSE_PREBUILT_DIR="$BUILD_DIR" \
    --config-settings=build-dir="$work/build"
  end=$(date +%s)
  echo "python_package_install: $((end - start)) s in all: $((deps - start)) s for the" \
       "environment and PyPI packages, $((end - deps)) s to build and install opfuse"
  ;;
cpu)
  cd "$work"  # not the source tree: the installed package is imported
  "$py" "$SOURCE_DIR/tests/python/test_package_cpu.py"
  # The stubs type-check a typed use of the package, and catch a misuse of it. Without mypy and
  # without network (a GPU machine) that part is skipped visibly (ctest: SKIP_RETURN_CODE); CI
  # installs mypy and runs it.
  if ! "$py" -c "import mypy" 2>/dev/null &&
    ! "$py" -m pip install -q --retries 1 --timeout 15 "${target[@]}" "mypy>=1.10"; then
    echo "python_package_cpu: [  SKIPPED ] the stub checks: no mypy, and PyPI unreachable"
    exit 77
  fi
  "$py" -m mypy --strict "$SOURCE_DIR/tests/python/typed_usage.py"
  if "$py" -m mypy --strict "$SOURCE_DIR/tests/python/typed_misuse.py" >"$work/misuse.txt"; then
    echo "mypy accepted tests/python/typed_misuse.py: the stubs do not type the API" >&2
    exit 1
  fi
  cat "$work/misuse.txt"
  # Exactly the marked lines, each once.
  expected=$(grep -n "  # error: " "$SOURCE_DIR/tests/python/typed_misuse.py" | cut -d: -f1)
  found=$(grep -o "typed_misuse.py:[0-9]*: error:" "$work/misuse.txt" | cut -d: -f2)
  if [ "$found" != "$expected" ]; then
    echo "mypy reported errors on lines [$(echo $found)] of typed_misuse.py; it marks" \
         "[$(echo $expected)]" >&2
    exit 1
  fi
  ;;
gpu)
  cd "$work"
  # OPFUSE_PY_TESTS: only these tests (unittest names, e.g. Sequential.test_host_time_per_forward).
  # shellcheck disable=SC2086
  "$py" "$SOURCE_DIR/tests/python/test_package_gpu.py" ${OPFUSE_PY_TESTS:-}
  ;;
*)
  echo "usage: $0 install|cpu|gpu WORK_DIR" >&2
  exit 2
  ;;
esac
