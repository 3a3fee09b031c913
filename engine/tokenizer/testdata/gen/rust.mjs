// Regenerates testdata/golden/rust.json: encodings and decodings of the
// committed WordPiece and Unigram test tokenizers by Hugging Face's Rust
// tokenizers (0.22.2, through the @anush008/tokenizers Node binding), the
// implementation this package follows. The JavaScript reference's goldens
// (wordpiece.mjs, unigram.mjs) cover more cases; this file adds the Rust
// answers on the same texts plus the inputs where the two references
// disagree (extra below), and a Unigram variant with Metaspace split, which
// the JavaScript reference ignores.
//
// Run from the repository root after sourcing the set-up (and after
// wordpiece.mjs and unigram.mjs):
//   MLXSERVING_ROOT=$PWD; source scripts/setup.d/20-tokenizers.sh
//   node engine/tokenizer/testdata/gen/rust.mjs
import { readFileSync, writeFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import { variant, variants } from "./variants.mjs";

const modules = process.env.MLXSERVING_TOKENIZERS;
if (!modules) throw new Error("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh");
const require = createRequire(join(modules, "noop.js"));
const { Tokenizer } = require("@anush008/tokenizers");

const testdata = join(dirname(fileURLToPath(import.meta.url)), "..");
const readJSON = (...p) => JSON.parse(readFileSync(join(testdata, ...p), "utf8"));

// Where the JavaScript reference departs from Rust: CJK ideographs outside
// the BMP, final capital sigma, İ, whitespace outside JavaScript's \s,
// an empty second text, runs of spaces under Metaspace split; and for the
// Precompiled normalizer (xlmr), grapheme clusters whose first character
// has a mapping, CR LF, compatibility characters, Hangul jamo, regional
// indicators, emoji sequences and Indic conjuncts.
const extra = {
  rust_graphemes: "Ａ\u0301x ﬁ\u0301 e\u0301\u0327 ™\u200d \r\n x\r\ny ①② ㍻ ｶﾞ \u1100\u1161\u11a8 가\u0301 🇺🇸🇫 👨\u200d👩 क्ष \u0600١ ℌ\u20d7",
  rust_controls: "a\u0000b\u0007c\u001fd\u007fe\u0085f\u00adg\u200bh\u200ci\u200dj\u2060k\ufeffl\ue000m\u2028n",
  rust_astral_cjk: "a\u{20000}b \u{2A700}\u{2F800}x \u{2B820}",
  rust_final_sigma: "ΟΔΟΣ ΣΟΦΟΣ Σ ΣΣ",
  rust_dotted_i: "İSTANBUL İi",
  rust_nel: "a\u0085b\u180ec",
  rust_spaces: "   a  b    c ",
  rust_empty: "",
};
const texts = { ...readJSON("corpus.json"), ...readJSON("wordpiece", "texts.json"), ...extra };
const keys = Object.keys(texts).sort();

const wordpiece = readJSON("wordpiece", "tokenizer.json");
const unigram = readJSON("unigram", "tokenizer.json");
const unigramSplit = structuredClone(unigram);
unigramSplit.pre_tokenizer.split = true;
unigramSplit.decoder.split = true;
const tokenizers = {
  ...Object.fromEntries(variants.map((v) => [v, variant(v, wordpiece)])),
  unigram,
  unigram_split: unigramSplit,
  tiny: readJSON("wordpiece", "tiny", "tokenizer.json"),
  xlmr: readJSON("xlmr", "tokenizer.json"),
};
// llama2_metaspace (encode.mjs's rewrite of the Llama 2 tokenizer): for
// the Metaspace decoder's first token, on the corpus only.
const llama2 = JSON.parse(readFileSync(join(modules, "@lenml", "tokenizer-llama2", "models", "tokenizer.json"), "utf8"));
const ms = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
Object.assign(llama2, { normalizer: null, pre_tokenizer: ms, decoder: ms });
const corpusKeys = new Set(Object.keys(readJSON("corpus.json")));

// Seeded random texts for the Precompiled normalizer only (xlmr): bases
// with a charsmap entry or none, combining and spacing marks, joiners,
// jamo, regional indicators, controls and spaces, to cross grapheme rules.
const graphemeParts = [
  "a", "e", "A", "Ａ", "ﬁ", "①", "㍻", "ｶ", "ﾞ", "™", "ℌ", "½", "é", "中", "가", "각", "\u1100", "\u1161", "\u11a8",
  "\u0301", "\u0327", "\u0308", "\u20d7", "\u093c", "\u0903", "\u0e33", "\u200d", "\u200c", "\ufe0f", "\u{1F3FD}",
  "क", "्", "ष", "\u0600", "१", "\u{1F1FA}", "\u{1F1F8}", "👨", "❤", "\r", "\n", "\t", " ", "  ", "\u00a0", "\u3000",
  "\u0000", "\u0007", "\u00ad", "\u200b", "\u2060", "\ufeff", "\ue000", "\u2028", "\u{E0041}", "\u{E0100}",
];
let seed = 29;
const rand = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed / 2147483648;
};
const xlmrTexts = {};
for (let i = 0; i < 300; i++) {
  let t = "";
  for (let n = 1 + Math.floor(rand() * 10); n > 0; n--) t += graphemeParts[Math.floor(rand() * graphemeParts.length)];
  xlmrTexts[`xlmr_${String(i).padStart(3, "0")}`] = t;
}

const out = { reference: "tokenizers 0.22.2 (Rust) via @anush008/tokenizers@0.6.0", extra, xlmr_extra: xlmrTexts, tokenizers: {} };
for (const [name, tj] of Object.entries({ ...tokenizers, llama2_metaspace: llama2 })) {
  const tok = Tokenizer.fromString(JSON.stringify(tj));
  const cases = {};
  const allKeys = name === "xlmr" ? [...keys, ...Object.keys(xlmrTexts)] : keys;
  for (const [i, key] of allKeys.entries()) {
    if (name === "llama2_metaspace" && !corpusKeys.has(key)) continue;
    if (key.startsWith("xlmr_")) {
      const enc = await tok.encode(xlmrTexts[key], null, { addSpecialTokens: false });
      cases[key] = { ids: enc.getIds() };
      continue;
    }
    const text = texts[key];
    const enc = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = enc.getIds();
    const c = { ids_special: ids, decoded_skip: await tok.decode(ids, true) };
    if (name !== "llama2_metaspace" && (i % 8 === 0 || key.startsWith("rust_"))) {
      // The pair with the next text in key order (rust_empty's successor
      // is rust_final_sigma; rust_dotted_i pairs with the empty text).
      const pair = await tok.encode(text, texts[keys[(i + 1) % keys.length]], { addSpecialTokens: true });
      c.ids_pair = pair.getIds();
      c.type_ids_pair = pair.getTypeIds();
    }
    cases[key] = c;
  }
  out.tokenizers[name] = cases;
  console.log(`${name}: ${Object.keys(cases).length} cases`);
}
writeFileSync(join(testdata, "golden", "rust.json"), JSON.stringify(out) + "\n");
