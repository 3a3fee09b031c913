// The BERT-style variants of testdata/wordpiece/tokenizer.json the
// goldens cover (wordpiece_test.go's wordPieceTokenizer applies the same
// rewrites): bert_uncased is the file as written (bert-base-uncased's
// settings); bert_cased is bert-base-cased's (no lowercasing, so no accent
// stripping, BertProcessing); bert_strip strips accents without
// lowercasing, leaves CJK alone, has a 12-character word limit and a
// decoder without cleanup.
export const variants = ["bert_uncased", "bert_cased", "bert_strip"];

export function variant(name, tj) {
  tj = structuredClone(tj);
  const vocab = tj.model.vocab;
  if (name === "bert_cased") {
    tj.normalizer.lowercase = false;
    tj.post_processor = { type: "BertProcessing", sep: ["[SEP]", vocab["[SEP]"]], cls: ["[CLS]", vocab["[CLS]"]] };
  } else if (name === "bert_strip") {
    tj.normalizer.lowercase = false;
    tj.normalizer.strip_accents = true;
    tj.normalizer.handle_chinese_chars = false;
    tj.model.max_input_chars_per_word = 12;
    tj.decoder.cleanup = false;
  } else if (name !== "bert_uncased") {
    throw new Error(`unknown variant ${name}`);
  }
  return tj;
}
