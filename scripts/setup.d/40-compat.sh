# The npm "openai" client for the compatibility tests in compat/ (a nested
# Go module). Installed into $MLXSERVING_ROOT/.cache/npm-openai (gitignored);
# idempotent and quick when already present. Sourced by scripts/test.sh.
#
# Exports:
#   MLXSERVING_NPM_OPENAI  node_modules dir holding the openai package
_compat_dir="$MLXSERVING_ROOT/.cache/npm-openai"
_compat_version="6"
if [ ! -f "$_compat_dir/node_modules/openai/package.json" ]; then
  if command -v npm >/dev/null 2>&1; then
    mkdir -p "$_compat_dir"
    [ -f "$_compat_dir/package.json" ] || echo '{"name":"mlxserving-compat","private":true}' >"$_compat_dir/package.json"
    (cd "$_compat_dir" && npm install --no-audit --no-fund --silent "openai@$_compat_version") ||
      echo "40-compat: npm install openai failed; the Node client test will skip (fail under CI)" >&2
  else
    echo "40-compat: npm not found; the Node client test will skip (fail under CI)" >&2
  fi
fi
export MLXSERVING_NPM_OPENAI="$_compat_dir/node_modules"
unset _compat_dir _compat_version
