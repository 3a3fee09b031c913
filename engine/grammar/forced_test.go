package grammar

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// objectSchema has five required keys, an enum and a const: most of its
// bytes are forced.
const objectSchema = `{"type":"object","properties":{
	"name":{"type":"string","maxLength":8},
	"age":{"type":"integer","minimum":0,"maximum":120},
	"status":{"enum":["active","inactive"]},
	"kind":{"const":"person"},
	"tags":{"type":"array","items":{"type":"string","maxLength":4},"maxItems":2}},
	"required":["name","age","status","kind","tags"],"additionalProperties":false}`

// TestForcedTokensObject follows a document of objectSchema: after '{'
// the key "name" is forced; after the enum's first letters its rest.
// Llama 2's tokenizer puts a space in front of what it encodes, which
// the forced run must not take.
func TestForcedTokensObject(t *testing.T) {
	for _, name := range []string{"llama3", "qwen3", "llama2"} {
		t.Run(name, func(t *testing.T) {
			v := realVocab(t, name)
			g, err := v.Compile([]byte(objectSchema), Limits{})
			if err != nil {
				t.Fatal(err)
			}
			m := g.NewMatcher()
			// Free whitespace is allowed but never forced.
			if got := decode(v, m.ForcedTokens(0)); !strings.HasPrefix(`{"name":"`, got) || len(got) < len(`{"name`) {
				t.Fatalf(`at the start forced %q; want a prefix of {"name":" of at least {"name`, got)
			}
			if err := m.AcceptBytes([]byte("{ ")); err != nil {
				t.Fatal(err)
			}
			forced := decode(v, m.ForcedTokens(0))
			if !strings.HasPrefix(`"name":"`, forced) || len(forced) < len(`"name`) {
				t.Fatalf(`after "{" forced %q; want a prefix of "name":" of at least "name`, forced)
			}
			// Ends the name and the age, then the forced key and a partial enum value.
			if err := m.AcceptBytes([]byte(`"name":"Al","age":7,"status":"ina`)); err != nil {
				t.Fatal(err)
			}
			forced = decode(v, m.ForcedTokens(0))
			if !strings.HasPrefix(`ctive","kind":"person","tags":[`, forced) || len(forced) < len(`ctive","kind":"person"`) {
				t.Fatalf("inside the enum value forced %q", forced)
			}
			if got := m.ForcedTokens(1); len(got) != 1 {
				t.Fatalf("ForcedTokens(1) returned %d tokens", len(got))
			}
		})
	}
}

// TestForcedTokensEnd: a run that ends the document is handed out whole,
// the last token included: only EOS can follow it.
func TestForcedTokensEnd(t *testing.T) {
	v := realVocab(t, "llama3")
	g, err := v.Compile([]byte(`{"type":"object","properties":{"a":{"const":"xyz"}},"required":["a"],"additionalProperties":false}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	m := g.NewMatcher()
	if err := m.AcceptBytes([]byte("{")); err != nil {
		t.Fatal(err)
	}
	ids := m.ForcedTokens(0)
	if got := decode(v, ids); got != `"a":"xyz"}` {
		t.Fatalf("forced %q; want the whole rest of the document", got)
	}
	for _, id := range ids {
		if err := m.Accept(id); err != nil {
			t.Fatal(err)
		}
	}
	if !m.Done() {
		t.Fatal("the forced run did not end the document")
	}
}

// TestForcedTokensWithoutEncoder: a vocabulary without a tokenizer
// forces nothing.
func TestForcedTokensWithoutEncoder(t *testing.T) {
	g, err := byteVocab().Compile([]byte(`{"const":"abc"}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := g.NewMatcher().ForcedTokens(0); got != nil {
		t.Fatalf("forced %v without an encoder", got)
	}
}

// checkForced asserts that ids, returned by m.ForcedTokens, are tokens the
// mask allows one after the other and that their bytes are the forced
// run's prefix, re-tokenized as the tokenizer does.
func checkForced(t testing.TB, v *Vocab, m *Matcher, ids []int32, mask []uint64) {
	t.Helper()
	if len(ids) == 0 {
		return
	}
	probe := &Matcher{g: m.g, states: m.states, w: walker{g: m.g}}
	var text []byte
	for _, id := range ids {
		probe.FillMask(mask)
		if !engine.MaskAllows(mask, id) {
			t.Fatalf("forced token %d (%q) after %q is not allowed by the mask", id, v.pieces[id], text)
		}
		if err := probe.Accept(id); err != nil {
			t.Fatal(err)
		}
		text = append(text, v.pieces[id]...)
	}
	run, _ := m.forcedBytes(MaxForcedBytes)
	if !bytes.HasPrefix(run, text) {
		t.Fatalf("forced tokens %q are not a prefix of the forced run %q", text, run)
	}
}

// jumpDoc generates one document as sampleDoc does, appending the forced
// tokens after every sampled one (jump-forward decoding), and checks each
// forced run. It returns the document, the tokens and the samples.
func jumpDoc(t testing.TB, g *Grammar, rng *rand.Rand, maxTokens int) (doc string, tokens, samples int) {
	t.Helper()
	m := g.NewMatcher()
	mask := make([]uint64, g.Vocab().MaskWords())
	var out []byte
	for tokens < maxTokens {
		if m.Done() {
			return string(out), tokens, samples
		}
		m.FillMask(mask)
		id, ok := pick(mask, rng)
		if !ok {
			t.Fatalf("no token allowed after %q", out)
		}
		if err := m.Accept(id); err != nil {
			t.Fatalf("Accept(%d) after %q: %v", id, out, err)
		}
		samples++
		tokens++
		if isEOS(g.v.eos, id) {
			return string(out), tokens, samples
		}
		out = append(out, g.v.pieces[id]...)
		forced := m.ForcedTokens(0)
		checkForced(t, g.v, m, forced, mask)
		for _, f := range forced {
			if err := m.Accept(f); err != nil {
				t.Fatalf("Accept(forced %d) after %q: %v", f, out, err)
			}
			out = append(out, g.v.pieces[f]...)
			tokens++
		}
	}
	t.Fatalf("document not finished in %d tokens: %q", maxTokens, out)
	return "", 0, 0
}

// TestJumpForwardObject: documents of objectSchema made with jump-forward
// validate and take far fewer samples than tokens.
func TestJumpForwardObject(t *testing.T) {
	for _, name := range []string{"llama3", "qwen3", "llama2"} {
		t.Run(name, func(t *testing.T) {
			v := realVocab(t, name)
			g, err := v.Compile([]byte(objectSchema), Limits{})
			if err != nil {
				t.Fatal(err)
			}
			val := validator(t, objectSchema)
			rng := rand.New(rand.NewPCG(3, 4))
			tokens, samples := 0, 0
			for range 20 {
				doc, n, s := jumpDoc(t, g, rng, 400)
				checkDoc(t, val, objectSchema, doc)
				var obj map[string]any
				if err := json.Unmarshal([]byte(doc), &obj); err != nil || obj["kind"] != "person" {
					t.Fatalf("document %q: %v", doc, err)
				}
				tokens += n
				samples += s
			}
			t.Logf("%d tokens, %d sampled", tokens, samples)
			if samples*10 > tokens*9 {
				t.Fatalf("%d of %d tokens were sampled: jump-forward forced almost nothing", samples, tokens)
			}
		})
	}
}

func decode(v *Vocab, ids []int32) string {
	var b []byte
	for _, id := range ids {
		b = append(b, v.pieces[id]...)
	}
	return string(b)
}
