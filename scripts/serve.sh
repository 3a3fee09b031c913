#!/usr/bin/env bash
# Serves the example OpenAI-compatible server (examples/server) on a real
# engine: the Python engine on Debian's python3-torch, installed the same
# way the test set-up installs it (scripts/setup.d/30-python.sh) when it is
# missing. Without -model it serves the project's generated test model
# (random weights); arguments go to the server, e.g.
#
#   bash scripts/serve.sh -model /models/Llama-3.2-1B-Instruct -addr 0.0.0.0:8080 -api-keys keys.json
set -euo pipefail
cd "$(dirname "$0")/.."
export MLXSERVING_ROOT="$PWD"

if ! /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "serve: installing Debian's python3-torch (once)" >&2
  # shellcheck source=/dev/null
  source scripts/setup.d/00-base.sh
fi
# shellcheck source=/dev/null
source scripts/setup.d/30-python.sh
if ! "$MLXSERVING_PYTHON" -c 'import torch' >/dev/null 2>&1; then
  echo "serve: $MLXSERVING_PYTHON cannot import torch; install python3-torch (as root: apt-get install python3-torch python3-numpy)" >&2
  exit 1
fi
exec go run ./examples/server -engine pyproc -python "$MLXSERVING_PYTHON" "$@"
