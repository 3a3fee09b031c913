#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian machine: installs what the tests
# need (each scripts/setup.d/*.sh installs one part and exports where it put
# it), then vet, gofmt and the race-enabled tests of every module.
set -euo pipefail
cd "$(dirname "$0")/.."
export MLXSERVING_ROOT="$PWD"

for setup in scripts/setup.d/*.sh; do
  echo "== setup: $setup"
  # shellcheck source=/dev/null
  source "$setup"
done

echo "== go vet"
go vet ./...
echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
echo "== go test -race"
go test -race -count=1 -timeout 30m ./... "$@"
if [ "${MLXSERVING_MLX:-0}" = 1 ]; then
  echo "== MLX engine (-tags mlx)"
  go vet -tags mlx ./engine/mlx ./internal/metal
  go test -race -tags mlx -count=1 -timeout 20m ./engine/mlx ./internal/metal
  # the serving stack's structured-output property test on the MLX engine
  go vet -tags mlx .
  go test -race -tags mlx -count=1 -timeout 10m -run 'TestMLX' .
elif [ -n "${CI:-}" ]; then
  echo "MLX is not available: the mlx-tagged tests cannot run under CI" >&2; exit 1
fi
echo "== compat (nested module: the official OpenAI clients)"
(cd compat && go vet ./... && go test -race -count=1 -timeout 15m ./...)
