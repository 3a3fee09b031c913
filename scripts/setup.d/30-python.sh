# Python for the pyproc engine's tests: Debian's system interpreter with
# PyTorch (CPU) and NumPy. Sourced by scripts/test.sh; quick when present.
# The tests read MLXSERVING_PYTHON (a pyenv python3 first on PATH would not
# see the apt packages, so the path is explicit).
if ! /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      python3 python3-torch python3-numpy >/dev/null ||
      echo "30-python: apt-get install python3-torch python3-numpy failed" >&2
  else
    echo "30-python: /usr/bin/python3 lacks torch; run as root with apt-get, or install python3-torch" >&2
  fi
fi
export MLXSERVING_PYTHON=/usr/bin/python3
