package openai_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai"
)

type embedReply struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (r *embedReply) vector(t *testing.T, i int) []float32 {
	t.Helper()
	var v []float32
	if json.Unmarshal(r.Data[i].Embedding, &v) == nil {
		return v
	}
	var s string
	if err := json.Unmarshal(r.Data[i].Embedding, &s); err != nil {
		t.Fatalf("embedding %d is neither floats nor base64: %s", i, r.Data[i].Embedding)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b)%4 != 0 {
		t.Fatalf("embedding %d: bad base64 (%v)", i, err)
	}
	v = make([]float32, len(b)/4)
	for j := range v {
		v[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
	}
	return v
}

func (f *fixture) embed(t *testing.T, body any, header ...string) (int, *embedReply, []byte) {
	t.Helper()
	status, _, b := f.post(t, "/v1/embeddings", body, header...)
	if status != http.StatusOK {
		return status, nil, b
	}
	var r embedReply
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("reply %s: %v", b, err)
	}
	return status, &r, b
}

func TestEmbeddings(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	status, r, b := f.embed(t, map[string]any{"model": "tiny", "input": []string{"hello world", "a second text", "hello world"}})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, b)
	}
	if r.Object != "list" || r.Model != "tiny" || len(r.Data) != 3 || r.Usage.PromptTokens == 0 || r.Usage.TotalTokens != r.Usage.PromptTokens {
		t.Fatalf("reply %s", b)
	}
	for i := range r.Data {
		v := r.vector(t, i)
		var n float64
		for _, x := range v {
			n += float64(x) * float64(x)
		}
		if r.Data[i].Object != "embedding" || r.Data[i].Index != i || len(v) != enginetest.DefaultEmbedDim || math.Abs(math.Sqrt(n)-1) > 1e-5 {
			t.Errorf("data[%d]: object %q index %d, %d values of norm %v", i, r.Data[i].Object, r.Data[i].Index, len(v), math.Sqrt(n))
		}
	}
	if a, c := r.vector(t, 0), r.vector(t, 2); string(r.Data[0].Embedding) != string(r.Data[2].Embedding) || len(a) != len(c) {
		t.Errorf("the same text twice got different vectors")
	}
	// base64 carries the same floats; token ids embed like their text.
	_, b64, _ := f.embed(t, map[string]any{"model": "tiny", "input": "hello world", "encoding_format": "base64"})
	if got, want := b64.vector(t, 0), r.vector(t, 0); !equalFloats(got, want) {
		t.Errorf("base64 vector differs from the float one")
	}
	_, toks, _ := f.embed(t, map[string]any{"model": "tiny", "input": [][]int{{5, 6, 7}, {8}}})
	_, one, _ := f.embed(t, map[string]any{"model": "tiny", "input": []int{5, 6, 7}})
	if len(toks.Data) != 2 || toks.Usage.PromptTokens != 4 || !equalFloats(toks.vector(t, 0), one.vector(t, 0)) {
		t.Errorf("token inputs: %d vectors, %d tokens", len(toks.Data), toks.Usage.PromptTokens)
	}
}

func equalFloats(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestEmbeddingsDimensions(t *testing.T) {
	f := newFixture(t, fixtureOpts{sim: []enginetest.SimOption{enginetest.WithEmbedding(16, engine.PoolMean, true, true)}})
	status, r, b := f.embed(t, map[string]any{"model": "tiny", "input": "some text", "dimensions": 4})
	if status != http.StatusOK || len(r.vector(t, 0)) != 4 {
		t.Fatalf("dimensions 4: status %d, %s", status, b)
	}
}

func TestEmbeddingsBadInput(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	long := strings.Repeat("word ", 3000)
	for _, tc := range []struct {
		name  string
		body  any
		param string
	}{
		{"empty string", map[string]any{"model": "tiny", "input": ""}, "input"},
		{"no inputs", map[string]any{"model": "tiny", "input": []string{}}, "input"},
		{"no input field", map[string]any{"model": "tiny"}, "input"},
		{"wrong type", map[string]any{"model": "tiny", "input": map[string]int{"a": 1}}, "input"},
		{"empty token list", map[string]any{"model": "tiny", "input": [][]int{{1}, {}}}, "input"},
		{"encoding format", map[string]any{"model": "tiny", "input": "x", "encoding_format": "float16"}, "encoding_format"},
		{"zero dimensions", map[string]any{"model": "tiny", "input": "x", "dimensions": 0}, "dimensions"},
		{"dimensions without matryoshka", map[string]any{"model": "tiny", "input": "x", "dimensions": 8}, "dimensions"},
		{"token outside the vocabulary", map[string]any{"model": "tiny", "input": []int{1, 1 << 30}}, "input[0]"},
		{"over the context", map[string]any{"model": "tiny", "input": long}, ""},
		{"unknown field", map[string]any{"model": "tiny", "input": "x", "temperature": 1}, "temperature"},
		{"no model", map[string]any{"input": "x"}, "model"},
	} {
		status, _, b := f.embed(t, tc.body)
		var e struct {
			Error struct {
				Param *string `json:"param"`
				Code  *string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		if status != http.StatusBadRequest || (tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param)) {
			t.Errorf("%s: status %d, %s; want 400 on %q", tc.name, status, b, tc.param)
		}
	}
	if status, _, b := f.embed(t, map[string]any{"model": "nope", "input": "x"}); status != http.StatusNotFound {
		t.Errorf("unknown model: %d %s", status, b)
	}
	status, r, b := f.embed(t, map[string]any{"model": "tiny", "input": long, "truncate": true})
	if status != http.StatusOK || r.Usage.PromptTokens != f.srv.Models()[0].ContextLength {
		t.Errorf("truncate: %d %s", status, b)
	}
}

func TestEmbeddingsKeys(t *testing.T) {
	keys := []openai.Key{{Name: "other", Secret: "sk-other-key", Models: []string{"another"}}, {Name: "app", Secret: "sk-app-key1"}}
	f := newFixture(t, fixtureOpts{handler: []openai.Option{openai.WithAPIKeys(keys...)}})
	body := map[string]any{"model": "tiny", "input": "x"}
	if status, _, _ := f.embed(t, body); status != http.StatusUnauthorized {
		t.Errorf("no key: %d", status)
	}
	if status, _, _ := f.embed(t, body, "Authorization", "Bearer sk-other-key"); status != http.StatusForbidden {
		t.Errorf("a key for another model: %d", status)
	}
	if status, _, b := f.embed(t, body, "Authorization", "Bearer sk-app-key1"); status != http.StatusOK {
		t.Errorf("an allowed key: %d %s", status, b)
	}
}
