package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// fileSpec is the part of tokenizer.json this package reads.
type fileSpec struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         json.RawMessage `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
}

type modelSpec struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]int32  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	Dropout                 *float64          `json:"dropout"`
}

// maxTokenID bounds token ids (real vocabularies stay far below), so a
// corrupt file cannot make the id tables huge.
const maxTokenID = 1 << 24

// Size limits on the files Load reads: a file larger than any real one is
// refused before it is read, so a hostile checkpoint cannot make loading
// allocate without bound.
const (
	// MaxTokenizerJSONBytes bounds tokenizer.json (real ones stay under 40 MB).
	MaxTokenizerJSONBytes = 128 << 20
	// MaxTokenizerConfigBytes bounds tokenizer_config.json.
	MaxTokenizerConfigBytes = 16 << 20
)

// Load reads dir/tokenizer.json and, if present, dir/tokenizer_config.json.
// Errors are *FileError values naming the file; they wrap ErrMalformed,
// ErrUnsupported or the error reading the file.
func Load(dir string) (*Tokenizer, error) {
	tokPath := filepath.Join(dir, "tokenizer.json")
	tokJSON, err := readBounded(tokPath, MaxTokenizerJSONBytes)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	cfgJSON, err := readBounded(cfgPath, MaxTokenizerConfigBytes)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return build(tokJSON, cfgJSON, tokPath, cfgPath)
}

// readBounded reads a regular file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &FileError{File: path, Reason: "cannot read: " + err.Error(), Err: err}
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, &FileError{File: path, Reason: "cannot read: " + err.Error(), Err: err}
	}
	if !st.Mode().IsRegular() {
		return nil, &FileError{File: path, Reason: "not a regular file", Err: ErrMalformed}
	}
	if st.Size() > limit {
		return nil, &FileError{File: path, Reason: fmt.Sprintf("%d bytes: larger than the %d-byte limit", st.Size(), limit), Err: ErrMalformed}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &FileError{File: path, Reason: "cannot read: " + err.Error(), Err: err}
	}
	if int64(len(b)) > limit {
		return nil, &FileError{File: path, Reason: fmt.Sprintf("larger than the %d-byte limit", limit), Err: ErrMalformed}
	}
	return b, nil
}

// FromJSON builds a tokenizer from the contents of tokenizer.json and
// tokenizer_config.json (configJSON may be nil). Errors are as for Load,
// naming "tokenizer.json" or "tokenizer_config.json".
func FromJSON(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	return build(tokenizerJSON, configJSON, "tokenizer.json", "tokenizer_config.json")
}

func build(tokJSON, cfgJSON []byte, tokName, cfgName string) (*Tokenizer, error) {
	if len(tokJSON) > MaxTokenizerJSONBytes {
		return nil, &FileError{File: tokName, Reason: "larger than the size limit", Err: ErrMalformed}
	}
	if len(cfgJSON) > MaxTokenizerConfigBytes {
		return nil, &FileError{File: cfgName, Reason: "larger than the size limit", Err: ErrMalformed}
	}
	t, err := parseTokenizer(tokJSON)
	if err != nil {
		return nil, nameFile(err, tokName)
	}
	if len(cfgJSON) > 0 {
		if err := t.applyConfig(cfgJSON, cfgName); err != nil {
			return nil, nameFile(err, cfgName)
		}
	}
	return t, nil
}

func nameFile(err error, name string) error {
	var fe *FileError
	if errors.As(err, &fe) {
		fe.File = name
		return fe
	}
	return &FileError{File: name, Reason: err.Error(), Err: ErrMalformed}
}

func parseTokenizer(data []byte) (*Tokenizer, error) {
	var spec fileSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, specErr("", ErrMalformed, "not valid JSON: %v", err)
	}
	if isNull(spec.Model) {
		return nil, specErr("model", ErrMalformed, "missing")
	}
	t := &Tokenizer{bl: newByteLevelTable()}
	var err error
	if t.normalizers, err = parseNormalizers(spec.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	byteLevel := false
	if !isNull(spec.PreTokenizer) {
		c, err := parseComponent(spec.PreTokenizer, "pre_tokenizer")
		if err != nil {
			return nil, err
		}
		if t.pre, byteLevel, err = parsePreTokenizer(c, "pre_tokenizer"); err != nil {
			return nil, err
		}
	}
	if t.post, err = parsePostProcessor(spec.PostProcessor, "post_processor"); err != nil {
		return nil, err
	}
	if t.dec, err = parseDecoder(spec.Decoder, "decoder"); err != nil {
		return nil, err
	}
	if err := t.buildModel(spec.Model, byteLevel); err != nil {
		return nil, err
	}
	if err := t.buildAdded(spec.AddedTokens); err != nil {
		return nil, err
	}
	postIDs := append(append([]int32(nil), t.post.prefix...), t.post.suffix...)
	for _, it := range t.post.pair {
		postIDs = append(postIDs, it.ids...)
	}
	for _, id := range postIDs {
		if id < 0 || int(id) >= t.vocabSize {
			return nil, specErr("post_processor", ErrMalformed, "special token id %d is outside the vocabulary", id)
		}
	}
	t.buildPieces()
	t.spaceSplit = t.safeSpaceSplit()
	return t, nil
}

func (t *Tokenizer) buildModel(raw json.RawMessage, byteLevel bool) error {
	var kind struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &kind); err != nil {
		return specErr("model", ErrMalformed, "%v", err)
	}
	switch {
	case kind.Type == "Unigram" && !byteLevel:
		return t.buildUnigram(raw)
	case kind.Type == "WordPiece" && !byteLevel:
		return t.buildWordPiece(raw)
	case kind.Type == "WordPiece" || kind.Type == "Unigram":
		return specErr("model.type", ErrUnsupported, "%s model with a ByteLevel pre-tokenizer", kind.Type)
	}
	var ms modelSpec
	if err := json.Unmarshal(raw, &ms); err != nil {
		return specErr("model", ErrMalformed, "%v", err)
	}
	switch {
	case ms.Type == "":
		if ms.Merges == nil {
			return specErr("model.type", ErrMalformed, "missing")
		}
	case ms.Type != "BPE":
		return specErr("model.type", ErrUnsupported, "model type %q (BPE, WordPiece and Unigram are implemented)", ms.Type)
	}
	if ms.Vocab == nil {
		return specErr("model.vocab", ErrMalformed, "missing")
	}
	if ms.Merges == nil {
		return specErr("model.merges", ErrMalformed, "missing")
	}
	if p := ms.ContinuingSubwordPrefix; p != nil && *p != "" {
		return specErr("model.continuing_subword_prefix", ErrUnsupported, "%q", *p)
	}
	if p := ms.EndOfWordSuffix; p != nil && *p != "" {
		return specErr("model.end_of_word_suffix", ErrUnsupported, "%q", *p)
	}
	m := &bpeModel{
		vocab: make(map[string]int32, len(ms.Vocab)), unk: -1, fuseUnk: ms.FuseUnk,
		byteFallback: ms.ByteFallback, ignoreMerges: ms.IgnoreMerges, byteLevel: byteLevel,
		cache: newWordCache(),
	}
	t.tokens = ms.Vocab
	for tok, id := range ms.Vocab {
		if id < 0 || id >= maxTokenID {
			return specErr("model.vocab", ErrMalformed, "token %q has id %d outside [0, %d)", tok, id, maxTokenID)
		}
		t.noteID(id)
		m.vocab[t.workForm(tok, byteLevel)] = id
	}
	if err := m.fillByteTokens(); err != nil {
		return err
	}
	if ms.UnkToken != nil {
		id, ok := ms.Vocab[*ms.UnkToken]
		if !ok {
			return specErr("model.unk_token", ErrMalformed, "%q is not in the vocabulary", *ms.UnkToken)
		}
		m.unk = id
	}
	if err := t.buildMerges(m, ms.Merges, byteLevel); err != nil {
		return err
	}
	t.model = m
	t.words = m
	return nil
}

// workForm is a vocabulary key as BPE sees it: raw bytes for byte-level
// models.
func (t *Tokenizer) workForm(tok string, byteLevel bool) string {
	if !byteLevel {
		return tok
	}
	raw, _ := t.bl.toBytes(tok)
	return string(raw)
}

func (m *bpeModel) fillByteTokens() error {
	for b := 0; b < 256; b++ {
		m.byteTokens[b] = -1
		key := fmt.Sprintf("<0x%02X>", b)
		if m.byteLevel {
			key = string([]byte{byte(b)})
		}
		if id, ok := m.vocab[key]; ok {
			m.byteTokens[b] = id
		} else if m.byteLevel {
			return specErr("model.vocab", ErrMalformed, "byte-level vocabulary lacks byte 0x%02X", b)
		}
	}
	return nil
}

func (t *Tokenizer) buildMerges(m *bpeModel, merges []json.RawMessage, byteLevel bool) error {
	m.merges = make(map[uint64]mergeRule, len(merges))
	for i, raw := range merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return specErr(fmt.Sprintf("model.merges[%d]", i), ErrMalformed, "%v", err)
		}
		a, b = t.workForm(a, byteLevel), t.workForm(b, byteLevel)
		ia, okA := m.vocab[a]
		ib, okB := m.vocab[b]
		id, okAB := m.vocab[a+b]
		if !okA || !okB || !okAB {
			return specErr(fmt.Sprintf("model.merges[%d]", i), ErrMalformed, "merge %q + %q uses a token missing from the vocabulary", a, b)
		}
		k := pairKey(ia, ib)
		if _, dup := m.merges[k]; !dup {
			m.merges[k] = mergeRule{rank: int32(i), id: id}
		}
	}
	return nil
}

// parseMerge reads "a b" or ["a", "b"]. Entries without escapes (nearly
// all) are cut directly; the rest go through encoding/json.
func parseMerge(raw json.RawMessage) (string, string, error) {
	if a, b, ok := quickMerge(raw); ok {
		return a, b, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return "", "", fmt.Errorf("merge %q has no space", s)
		}
		return a, b, nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("merge is neither \"a b\" nor [a, b]")
	}
	return pair[0], pair[1], nil
}

// quickMerge parses an escape-free merge entry without encoding/json.
func quickMerge(raw []byte) (string, string, bool) {
	if bytes.IndexByte(raw, '\\') >= 0 || len(raw) < 2 {
		return "", "", false
	}
	if raw[0] == '"' && raw[len(raw)-1] == '"' {
		a, b, ok := strings.Cut(string(raw[1:len(raw)-1]), " ")
		return a, b, ok && !strings.Contains(b, `"`)
	}
	if raw[0] != '[' || raw[len(raw)-1] != ']' {
		return "", "", false
	}
	parts := strings.Split(string(raw[1:len(raw)-1]), ",")
	if len(parts) != 2 {
		return "", "", false
	}
	a, okA := quotedPlain(strings.TrimSpace(parts[0]))
	b, okB := quotedPlain(strings.TrimSpace(parts[1]))
	return a, b, okA && okB
}

func quotedPlain(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' || strings.Contains(s[1:len(s)-1], `"`) {
		return "", false
	}
	return s[1 : len(s)-1], true
}

func (t *Tokenizer) noteID(id int32) {
	if int(id)+1 > t.vocabSize {
		t.vocabSize = int(id) + 1
	}
}

func (t *Tokenizer) buildAdded(added []addedToken) error {
	t.addedByID = make(map[int32]*addedToken, len(added))
	t.addedByContent = make(map[string]int32, len(added))
	for i := range added {
		a := &added[i]
		if a.ID < 0 || a.ID >= maxTokenID {
			return specErr(fmt.Sprintf("added_tokens[%d]", i), ErrMalformed, "id %d outside [0, %d)", a.ID, maxTokenID)
		}
		if a.Content == "" {
			return specErr(fmt.Sprintf("added_tokens[%d]", i), ErrMalformed, "empty content")
		}
		t.noteID(a.ID)
		t.addedByID[a.ID] = a
		t.addedByContent[a.Content] = a.ID
	}
	t.added = newAddedMatcher(added)
	return nil
}

// safeSpaceSplit returns "\u2581" when a SentencePiece-style model (no
// pre-tokenizer) may be encoded word by word: no vocabulary token holds
// the rune after a different character.
func (t *Tokenizer) safeSpaceSplit() string {
	const sep = "\u2581"
	if t.pre != nil || t.model == nil || t.model.byteLevel {
		return ""
	}
	for tok := range t.model.vocab {
		rest := strings.TrimLeft(tok, sep)
		if strings.Contains(rest, sep) {
			return ""
		}
	}
	return sep
}

// buildPieces precomputes each id's decoded bytes.
func (t *Tokenizer) buildPieces() {
	t.pieces = make([][]byte, t.vocabSize)
	t.special = make([]bool, t.vocabSize)
	for tok, id := range t.tokens {
		t.pieces[id] = t.dec.tokenBytes(tok, t.bl)
	}
	for id, a := range t.addedByID {
		t.pieces[id] = t.dec.tokenBytes(a.Content, t.bl)
		t.special[id] = a.Special
	}
	if _, ok := t.dec.firstBytes("", t.bl); ok {
		t.firstPieces = map[int32][]byte{}
		note := func(tok string, id int32) {
			// appendPiece strips one leading space from a first piece;
			// keep only the tokens for which that is not the right text.
			first, _ := t.dec.firstBytes(tok, t.bl)
			if !bytes.Equal(first, bytes.TrimPrefix(t.pieces[id], []byte(" "))) {
				t.firstPieces[id] = first
			}
		}
		for tok, id := range t.tokens {
			if _, added := t.addedByID[id]; !added {
				note(tok, id)
			}
		}
		for id, a := range t.addedByID {
			note(a.Content, id)
		}
	}
}
