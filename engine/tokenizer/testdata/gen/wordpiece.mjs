// Regenerates the WordPiece test data:
//   testdata/wordpiece/tokenizer.json  a BERT-style tokenizer (BertNormalizer,
//       BertPreTokenizer, TemplateProcessing, WordPiece model and decoder)
//       whose vocabulary is derived from the Llama 2 SentencePiece pieces
//       ("▁word" becomes "word", "iece" becomes "##iece") plus every
//       character of the test texts in both forms;
//   testdata/golden/encode_bert_*.json  reference encodings and decodings
//       by @huggingface/tokenizers of three variants of it (variants.mjs)
//       on testdata/corpus.json and testdata/wordpiece/texts.json (the
//       BERT-specific texts below and 200 seeded random texts, written
//       here too).
//
// Run from the repository root after sourcing the set-up:
//   MLXSERVING_ROOT=$PWD; source scripts/setup.d/20-tokenizers.sh
//   node engine/tokenizer/testdata/gen/wordpiece.mjs
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import { variant, variants } from "./variants.mjs";

const modules = process.env.MLXSERVING_TOKENIZERS;
if (!modules) throw new Error("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh");
const require = createRequire(join(modules, "noop.js"));
const mod = await import(require.resolve("@huggingface/tokenizers"));
const Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;

const testdata = join(dirname(fileURLToPath(import.meta.url)), "..");
const corpus = JSON.parse(readFileSync(join(testdata, "corpus.json"), "utf8"));

// Texts aimed at BERT's rules: clean_text, CJK spacing, accents, ASCII
// symbols that count as punctuation, the character limit, inline special
// tokens.
const extra = {
  wp_accents: "Héllo Wörld, naïve café Ångström ÉCOLE e\u0301 n\u0303 Ⅻ ﬁ",
  wp_ascii_symbols: "$5.00 + 3 = <x> ^_^ `code` |pipe| ~tilde @home #tag 100% a&b",
  wp_cjk: "中文字符测试，日本語の文章とカタカナ。한국어 문장입니다!",
  wp_control: "a\u0000b\u001fc\u007fd\u200be\u00adf\ufeffg\ue000h\ufffdi\u0085j",
  wp_continuation_literal: "un##affable ## ##ing #",
  wp_fullwidth: "ＡＢＣ１２３！？",
  wp_istanbul: "İstanbul İİ DİYARBAKIR ıi",
  wp_long_word: "a".repeat(99) + " " + "b".repeat(100) + " " + "c".repeat(101) + " " + "ab".repeat(60),
  wp_mixed_case: "HELLO,WORLD!! McDonald's iPhone eBay",
  wp_punct_unicode: "«quoted» „low“ — dash – en … ellipsis ¿qué? ¡sí! 「括弧」、。·•",
  wp_special_inline: "Hello [MASK] world [CLS][SEP] x[PAD]y [UNK]",
  wp_unicode_spaces: "a\u00a0b\u2003c\u3000d\u2028e\u2029f\u202fg\u205fh\u1680i\tj\nk\rl\u000bm\u000cn",
};

// Character palette for the random texts. Left out on purpose, where the
// JavaScript reference differs from Hugging Face's Rust implementation
// (which this package follows; wordpiece_test.go checks those cases):
// CJK ideographs outside the BMP (not spaced out by the reference) and
// capital sigma (lowercased by context in the reference, not in Rust).
const fragments = [
  "the", "The", "THE", "quick", "brown", "fox", "jumps", "running", "unbelievable", "tokenization",
  "Hello", "world", "naïve", "café", "CAFÉ", "Über", "straße", "señor", "façade", "Ångström",
  "中", "文", "字", "测试", "日本", "語", "の", "カタカナ", "한국어", "Привет", "мир", "ΑΒΓ", "λόγος",
  "ab", "xyz", "q", "Z", "1", "42", "3.14", "٣", "١٢", "½",
  ".", ",", "!", "?", "'", "\"", "-", "(", ")", "[", "]", "{", "}", "$", "+", "<", "=", ">", "^", "`", "|", "~", "@", "#", "##", "%", "&", "*", "/", "\\", ":", ";", "_",
  "«", "»", "—", "…", "¿", "¡", "、", "。", "「", "」", "·", "€", "©", "°", "±", "™", "→",
  " ", " ", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u2003", "\u3000", "\u2028",
  "\u0000", "\u0007", "\u001b", "\u007f", "\u200b", "\u00ad", "\ufeff", "\ue000", "\ufffd",
  "e\u0301", "a\u0308", "\u0301", "İ", "ı", "ß", "ẞ", "ǅ", "ﬁ",
  "😀", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "𝄞",
  "[CLS]", "[SEP]", "[MASK]", "[UNK]", "[PAD]",
];

function mulberry32(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const rand = mulberry32(39);
const randomTexts = {};
for (let i = 0; i < 200; i++) {
  const n = 1 + Math.floor(rand() * 14);
  let s = "";
  for (let j = 0; j < n; j++) {
    let f = fragments[Math.floor(rand() * fragments.length)];
    if (rand() < 0.05) f = f.repeat(2 + Math.floor(rand() * 8)); // long words, runs
    s += f;
  }
  randomTexts[`random_${String(i).padStart(3, "0")}`] = s;
}

const texts = { ...corpus, ...extra, ...randomTexts };
mkdirSync(join(testdata, "wordpiece"), { recursive: true });
writeFileSync(join(testdata, "wordpiece", "texts.json"), JSON.stringify({ ...extra, ...randomTexts }, null, 1) + "\n");

// The vocabulary.
const llama = JSON.parse(readFileSync(join(modules, "@lenml", "tokenizer-llama2", "models", "tokenizer.json"), "utf8"));
const specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
const vocab = {};
const add = (tok) => {
  if (!(tok in vocab)) vocab[tok] = Object.keys(vocab).length;
};
specials.forEach(add);
const chars = new Set();
for (const t of Object.values({ ...corpus, ...extra })) {
  for (const form of [t, t.toLowerCase(), t.normalize("NFD"), t.toLowerCase().normalize("NFD")]) {
    for (const c of form) if (!/\s/u.test(c)) chars.add(c);
  }
}
for (const c of [...chars].sort((a, b) => a.codePointAt(0) - b.codePointAt(0))) {
  add(c);
  add("##" + c);
}
const pieces = Object.entries(llama.model.vocab).sort((a, b) => a[1] - b[1]);
for (const [piece, id] of pieces) {
  if (id < 259 || id >= 259 + 6000) continue; // specials and bytes; then the 6000 first merges
  const word = piece.startsWith("\u2581") ? piece.slice(1) : "##" + piece;
  if (word === "" || word === "##" || word.includes("\u2581")) continue;
  add(word);
}

const base = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: specials.map((content, id) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  })),
  normalizer: { type: "BertNormalizer", clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true },
  pre_tokenizer: { type: "BertPreTokenizer" },
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "[CLS]", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "[SEP]", type_id: 0 } }],
    pair: [
      { SpecialToken: { id: "[CLS]", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "[SEP]", type_id: 0 } },
      { Sequence: { id: "B", type_id: 1 } }, { SpecialToken: { id: "[SEP]", type_id: 1 } },
    ],
    special_tokens: {
      "[CLS]": { id: "[CLS]", ids: [vocab["[CLS]"]], tokens: ["[CLS]"] },
      "[SEP]": { id: "[SEP]", ids: [vocab["[SEP]"]], tokens: ["[SEP]"] },
    },
  },
  decoder: { type: "WordPiece", prefix: "##", cleanup: true },
  model: { type: "WordPiece", unk_token: "[UNK]", continuing_subword_prefix: "##", max_input_chars_per_word: 100, vocab },
};
mkdirSync(join(testdata, "wordpiece"), { recursive: true });
writeFileSync(join(testdata, "wordpiece", "tokenizer.json"), JSON.stringify(base) + "\n");
console.log(`wordpiece/tokenizer.json: ${Object.keys(vocab).length} tokens`);

const decodeOnly = [
  ["##ing", "he", "##ll", "."],
  ["###", "#", "##."],
  [".", "the", ",", "world", "!", "?", "'", "s"],
  ["[CLS]", "##ing", "[SEP]"],
];

mkdirSync(join(testdata, "golden"), { recursive: true });
for (const name of variants) {
  const tok = new Tokenizer(variant(name, base), {});
  const cases = {};
  const keys = Object.keys(texts).sort();
  keys.forEach((key, i) => {
    const text = texts[key];
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const idsSpecial = tok.encode(text, { add_special_tokens: true }).ids;
    cases[key] = {
      ids,
      ids_special: idsSpecial,
      decoded: ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
      decoded_skip: idsSpecial.length === 0 ? "" : tok.decode(idsSpecial, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
    };
    if (i % 4 === 0) {
      // Every fourth text with the next one in key order as a pair.
      const pairText = texts[keys[(i + 1) % keys.length]];
      const pair = tok.encode(text, { text_pair: pairText, add_special_tokens: true, return_token_type_ids: true });
      cases[key].ids_pair = pair.ids;
      cases[key].type_ids_pair = pair.token_type_ids;
    }
  });
  const decodes = decodeOnly.map((tokens) => {
    const ids = tokens.map((t) => {
      if (!(t in vocab)) throw new Error(`decode case token ${t} is not in the vocabulary`);
      return vocab[t];
    });
    return {
      ids,
      decoded: tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
      decoded_skip: tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
    };
  });
  const out = { tokenizer: "testdata/wordpiece/tokenizer.json", variant: name, reference: "@huggingface/tokenizers", cases, decodes };
  writeFileSync(join(testdata, "golden", `encode_${name}.json`), JSON.stringify(out, null, 0) + "\n");
  console.log(`encode_${name}.json: ${Object.keys(cases).length} cases`);
}
