// Regenerates the Unigram test data:
//   testdata/unigram/tokenizer.json  an XLM-RoBERTa-shaped tokenizer
//       (Metaspace pre-tokenizer and decoder, <s> $A </s> template, a
//       Unigram model with unk_id) whose pieces and scores are derived from
//       the Llama 2 SentencePiece vocabulary: the 6000 first merges plus
//       every single-character piece, scored -ln(rank) rounded to two
//       decimals, so that equal scores (ties) occur; the normalizer is NFKC
//       (the Precompiled charsmap real files carry is not supported);
//   testdata/golden/encode_unigram.json  reference encodings by
//       @huggingface/tokenizers on testdata/corpus.json and
//       testdata/wordpiece/texts.json.
//
// Run from the repository root after sourcing the set-up (and after
// testdata/gen/wordpiece.mjs, which writes the texts):
//   MLXSERVING_ROOT=$PWD; source scripts/setup.d/20-tokenizers.sh
//   node engine/tokenizer/testdata/gen/unigram.mjs
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const modules = process.env.MLXSERVING_TOKENIZERS;
if (!modules) throw new Error("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh");
const require = createRequire(join(modules, "noop.js"));
const mod = await import(require.resolve("@huggingface/tokenizers"));
const Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;

const testdata = join(dirname(fileURLToPath(import.meta.url)), "..");
const texts = {
  ...JSON.parse(readFileSync(join(testdata, "corpus.json"), "utf8")),
  ...JSON.parse(readFileSync(join(testdata, "wordpiece", "texts.json"), "utf8")),
};

const llama = JSON.parse(readFileSync(join(modules, "@lenml", "tokenizer-llama2", "models", "tokenizer.json"), "utf8"));
const specials = ["<s>", "<pad>", "</s>", "<unk>"];
const vocab = specials.map((p) => [p, 0]);
for (const [piece, id] of Object.entries(llama.model.vocab).sort((a, b) => a[1] - b[1])) {
  if (id < 259) continue; // specials and byte tokens
  if (id >= 259 + 6000 && [...piece].length !== 1) continue;
  vocab.push([piece, -Math.round(Math.log(id) * 100) / 100]);
}
vocab.push(["<mask>", 0]);
const ids = Object.fromEntries(vocab.map(([p], i) => [p, i]));
// split is false: the reference's Metaspace never splits (Hugging Face
// splits before each "▁" when split is true, as this package does).
const metaspace = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "always", split: false };
const tj = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [...specials, "<mask>"].map((content) => ({
    id: ids[content], content, single_word: false, lstrip: content === "<mask>", rstrip: false, normalized: false, special: true,
  })),
  normalizer: { type: "NFKC" },
  pre_tokenizer: metaspace,
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } }],
    pair: [
      { SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } },
      { SpecialToken: { id: "</s>", type_id: 0 } }, { Sequence: { id: "B", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } },
    ],
    special_tokens: {
      "<s>": { id: "<s>", ids: [ids["<s>"]], tokens: ["<s>"] },
      "</s>": { id: "</s>", ids: [ids["</s>"]], tokens: ["</s>"] },
    },
  },
  decoder: metaspace,
  model: { type: "Unigram", unk_id: ids["<unk>"], vocab, byte_fallback: false },
};
mkdirSync(join(testdata, "unigram"), { recursive: true });
writeFileSync(join(testdata, "unigram", "tokenizer.json"), JSON.stringify(tj) + "\n");
console.log(`unigram/tokenizer.json: ${vocab.length} pieces`);

const tok = new Tokenizer(tj, {});
const cases = {};
for (const key of Object.keys(texts).sort()) {
  const text = texts[key];
  const idsPlain = tok.encode(text, { add_special_tokens: false }).ids;
  const idsSpecial = tok.encode(text, { add_special_tokens: true }).ids;
  cases[key] = {
    ids: idsPlain,
    ids_special: idsSpecial,
    decoded: idsPlain.length === 0 ? "" : tok.decode(idsPlain, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
    decoded_skip: idsSpecial.length === 0 ? "" : tok.decode(idsSpecial, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
  };
}
const out = { tokenizer: "testdata/unigram/tokenizer.json", reference: "@huggingface/tokenizers", cases };
writeFileSync(join(testdata, "golden", "encode_unigram.json"), JSON.stringify(out, null, 0) + "\n");
console.log(`encode_unigram.json: ${Object.keys(cases).length} cases`);
