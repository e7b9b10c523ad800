#!/usr/bin/env bash
# Run paramdict's full test suite against one torch release, in a throwaway venv.
#
# Usage:
#   scripts/test-torch.sh VERSION [PYTEST_ARGS...]
#
# Examples:
#   scripts/test-torch.sh 2.4.1
#   scripts/test-torch.sh 2.4.1 tests/test_pytree.py -x
#
# Creates (or reuses) the virtual environment $VENV_ROOT/venv-torch-VERSION, installs
# torch==VERSION and the test dependencies into it, then runs pytest from the repository
# root with the checkout on PYTHONPATH, so the working tree's `paramdict` is tested
# without installing it. It prints the torch and Python versions and the date before the
# pytest summary: the line for the compatibility table in the README.
#
# Environment:
#   PYTHON     interpreter that creates the venv (default: python3)
#   VENV_ROOT  where the venv goes (default: /tmp)
#   NUMPY      numpy requirement (default: "numpy<2" below torch 2.3, else "numpy")
#   OMP_NUM_THREADS  defaults to 1
#
# PyPI's Linux wheels of torch are CUDA builds that pull in the nvidia-* packages
# (several GB); they run on CPU. Delete the venv when done:
#   rm -rf "${VENV_ROOT:-/tmp}/venv-torch-VERSION"
#
# For people checking compatibility by hand; CI tests the pinned torch only and does not
# run this script.
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
version="$1"
shift

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV_ROOT:-/tmp}/venv-torch-${version}"
python="${PYTHON:-python3}"

if [[ -z "${NUMPY:-}" ]]; then
  IFS=. read -r major minor _ <<<"$version"
  if ((major < 2 || (major == 2 && minor < 3))); then
    NUMPY="numpy<2"
  else
    NUMPY="numpy"
  fi
fi

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "torch==${version}"
"$venv/bin/python" -m pip install --quiet \
  pytest hypothesis "$NUMPY" attrs typing_extensions tqdm matplotlib lightning

cd "$root"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
"$venv/bin/python" - <<'PY'
import datetime
import platform

import torch

print(
    f"torch {torch.__version__}, Python {platform.python_version()}, "
    f"{datetime.date.today().isoformat()}"
)
PY
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
