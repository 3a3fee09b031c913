package tokenizer

import (
	"path/filepath"
	"slices"
	"testing"
)

// TestEncodeGolden compares Encode and Decode with the reference
// implementation's output (testdata/golden, made by testdata/gen/encode.mjs)
// on every corpus entry for every real tokenizer.
func TestEncodeGolden(t *testing.T) {
	corpus := loadCorpus(t)
	for _, name := range append(realTokenizers, "llama2_metaspace") {
		t.Run(name, func(t *testing.T) {
			tok := realTokenizer(t, name)
			var golden struct {
				Cases map[string]goldenCase `json:"cases"`
			}
			readJSON(t, filepath.Join("testdata", "golden", "encode_"+name+".json"), &golden)
			if len(golden.Cases) != len(corpus) {
				t.Fatalf("golden has %d cases, corpus %d: regenerate with testdata/gen/encode.mjs", len(golden.Cases), len(corpus))
			}
			for key, want := range golden.Cases {
				text := corpus[key]
				got, err := tok.Encode(text, false)
				if err != nil {
					t.Errorf("%s: Encode: %v", key, err)
					continue
				}
				if !slices.Equal(got, want.IDs) {
					t.Errorf("%s: Encode(%q)\n got %v\nwant %v", key, text, got, want.IDs)
				}
				gotS, _ := tok.Encode(text, true)
				if !slices.Equal(gotS, want.IDsSpecial) {
					t.Errorf("%s: Encode(addSpecial)\n got %v\nwant %v", key, gotS, want.IDsSpecial)
				}
				dec, err := tok.Decode(want.IDs, false)
				if (err != nil || dec != want.Decoded) && !jsMetaspaceDiffers(tok, want.IDs, false) {
					t.Errorf("%s: Decode = %q, %v; want %q", key, dec, err, want.Decoded)
				}
				decS, err := tok.Decode(want.IDsSpecial, true)
				if (err != nil || decS != want.DecodedSkip) && !jsMetaspaceDiffers(tok, want.IDsSpecial, true) {
					t.Errorf("%s: Decode(skipSpecial) = %q, %v; want %q", key, decS, err, want.DecodedSkip)
				}
			}
		})
	}
}
