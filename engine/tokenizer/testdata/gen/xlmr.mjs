// Regenerates testdata/xlmr/tokenizer.json: an XLM-RoBERTa-shaped Unigram
// tokenizer with a real Precompiled normalizer, converted the way
// transformers converts SentencePiece models (Precompiled charsmap, then
// runs of spaces collapsed; Metaspace; <s> $A </s>) from a SentencePiece
// unigram model trained on the test texts. Its charsmap is SentencePiece's
// built-in nmt_nfkc rule set, the one XLM-RoBERTa's model carries.
//
// Run from the repository root, with Debian's sentencepiece package
// installed (spm_train trains the model: every line of
// testdata/corpus.json and testdata/wordpiece/texts.json, three times, an
// 800-piece unigram vocabulary), then regenerate the goldens with rust.mjs:
//   node engine/tokenizer/testdata/gen/xlmr.mjs
import { readFileSync, writeFileSync, mkdirSync, mkdtempSync } from "node:fs";
import { join, dirname } from "node:path";
import { tmpdir } from "node:os";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const testdata = join(dirname(fileURLToPath(import.meta.url)), "..");
const work = mkdtempSync(join(tmpdir(), "xlmr-"));
const lines = [];
for (const f of [["corpus.json"], ["wordpiece", "texts.json"]]) {
  for (const v of Object.values(JSON.parse(readFileSync(join(testdata, ...f), "utf8")))) {
    lines.push(...v.replaceAll("\r", "\n").split("\n").filter((l) => l.trim() !== ""));
  }
}
writeFileSync(join(work, "train.txt"), [...lines, ...lines, ...lines].join("\n") + "\n");
execFileSync("spm_train", [`--input=${join(work, "train.txt")}`, `--model_prefix=${join(work, "m")}`, "--vocab_size=800",
  "--model_type=unigram", "--character_coverage=1.0", "--hard_vocab_limit=false", "--num_threads=1"], { stdio: "ignore" });
const model = readFileSync(join(work, "m.model"));

// A minimal protobuf reader: (field, wire type, value) of one message.
function* fields(buf) {
  let i = 0;
  const varint = () => {
    let v = 0n, shift = 0n;
    for (;;) {
      const b = buf[i++];
      v |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) return v;
      shift += 7n;
    }
  };
  while (i < buf.length) {
    const key = Number(varint());
    const field = key >> 3, wire = key & 7;
    if (wire === 0) yield [field, wire, varint()];
    else if (wire === 1) { yield [field, wire, buf.subarray(i, i + 8)]; i += 8; }
    else if (wire === 2) { const n = Number(varint()); yield [field, wire, buf.subarray(i, i + n)]; i += n; }
    else if (wire === 5) { yield [field, wire, buf.subarray(i, i + 4)]; i += 4; }
    else throw new Error(`wire type ${wire}`);
  }
}

const vocab = [];
let unk = -1, charsmap = null;
const types = [];
for (const [f, , v] of fields(model)) {
  if (f === 1) { // SentencePiece {piece = 1, score = 2, type = 3}
    let piece = "", score = 0, type = 1;
    for (const [g, , w] of fields(v)) {
      if (g === 1) piece = Buffer.from(w).toString("utf8");
      if (g === 2) score = Buffer.from(w).readFloatLE(0);
      if (g === 3) type = Number(w);
    }
    if (type === 2) unk = vocab.length;
    types.push(type);
    vocab.push([piece, score]);
  } else if (f === 3) { // NormalizerSpec {precompiled_charsmap = 2}
    for (const [g, , w] of fields(v)) if (g === 2) charsmap = Buffer.from(w).toString("base64");
  }
}
if (unk < 0 || !charsmap) throw new Error("model lacks an unknown piece or a charsmap");
const special = vocab.map(([p], i) => [p, i]).filter(([, i]) => types[i] === 2 || types[i] === 3);
const id = Object.fromEntries(vocab.map(([p], i) => [p, i]));
const metaspace = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "always", split: true };
const tj = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: special.map(([content, i]) => ({
    id: i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  })),
  normalizer: {
    type: "Sequence",
    normalizers: [
      { type: "Precompiled", precompiled_charsmap: charsmap },
      { type: "Replace", pattern: { Regex: " {2,}" }, content: " " },
    ],
  },
  pre_tokenizer: metaspace,
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } }],
    pair: [
      { SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } },
      { SpecialToken: { id: "</s>", type_id: 0 } }, { Sequence: { id: "B", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } },
    ],
    special_tokens: {
      "<s>": { id: "<s>", ids: [id["<s>"]], tokens: ["<s>"] },
      "</s>": { id: "</s>", ids: [id["</s>"]], tokens: ["</s>"] },
    },
  },
  decoder: metaspace,
  model: { type: "Unigram", unk_id: unk, vocab, byte_fallback: false },
};
mkdirSync(join(testdata, "xlmr"), { recursive: true });
writeFileSync(join(testdata, "xlmr", "tokenizer.json"), JSON.stringify(tj) + "\n");
console.log(`xlmr/tokenizer.json: ${vocab.length} pieces, charsmap ${Buffer.from(charsmap, "base64").length} bytes`);
