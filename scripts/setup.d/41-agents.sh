# Agent frameworks for the tool-calling compatibility test in compat/:
# LangChain JS (@langchain/openai) and the Vercel AI SDK (ai with
# @ai-sdk/openai-compatible), with zod for their schemas. Installed into
# $MLXSERVING_ROOT/.cache/npm-agents (gitignored); idempotent and quick
# when already present. Sourced by scripts/test.sh.
#
# Exports:
#   MLXSERVING_NPM_AGENTS  node_modules dir holding those packages
_agents_dir="$MLXSERVING_ROOT/.cache/npm-agents"
if [ ! -f "$_agents_dir/node_modules/@langchain/openai/package.json" ] || [ ! -f "$_agents_dir/node_modules/ai/package.json" ]; then
  if command -v npm >/dev/null 2>&1; then
    mkdir -p "$_agents_dir"
    [ -f "$_agents_dir/package.json" ] || echo '{"name":"mlxserving-agents","private":true}' >"$_agents_dir/package.json"
    (cd "$_agents_dir" && npm install --no-audit --no-fund --silent \
      "@langchain/openai@1" "@langchain/core@1" "ai@7" "@ai-sdk/openai-compatible@3" "zod@4") ||
      echo "41-agents: npm install failed; the agent framework test will skip (fail under CI)" >&2
  else
    echo "41-agents: npm not found; the agent framework test will skip (fail under CI)" >&2
  fi
fi
export MLXSERVING_NPM_AGENTS="$_agents_dir/node_modules"
unset _agents_dir
