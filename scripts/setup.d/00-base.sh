# Base tools: refresh the package lists once so later set-up steps can
# apt-get install. Sourced by scripts/test.sh.
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq >/dev/null || echo "apt-get update failed; continuing with cached lists" >&2
fi
mkdir -p "$MLXSERVING_ROOT/.cache"
