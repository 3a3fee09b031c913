package pyproc

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
)

// TestStructuredThroughServer: JSON-schema requests on the random-weight
// test model (real worker, masks crossing the protocol, the model's own
// logits deciding among allowed tokens) end with complete documents that
// validate.
func TestStructuredThroughServer(t *testing.T) {
	srv := newServer(t, newEngine(t), engine.ModelSpec{ID: "tiny", Path: tiny(t)})
	schemas := []string{
		`{"type":"object","properties":{"name":{"type":"string","maxLength":10},"age":{"type":"integer","minimum":0,"maximum":99}},"required":["name","age"],"additionalProperties":false}`,
		`{"type":"array","items":{"enum":["red","green","blue"]},"minItems":1,"maxItems":4}`,
		`{"anyOf":[{"type":"number","minimum":-5,"maximum":5},{"type":"boolean"},{"type":"null"}]}`,
		`{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-f0-9]{4}$"},"tags":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":2},"ok":{"const":true}},"required":["id","tags","ok"]}`,
		`{"$defs":{"p":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"],"additionalProperties":false}},"type":"array","items":{"$ref":"#/$defs/p"},"maxItems":2}`,
	}
	for i, schema := range schemas {
		for seed := uint64(0); seed < 3; seed++ {
			structuredDoc(t, srv, schema, i, engine.SamplingParams{Temperature: 1, Seed: seed, HasSeed: true})
		}
	}
}

// newServer serves spec on e for a test or benchmark and closes the
// server at its end.
func newServer(t testing.TB, e *Engine, spec engine.ModelSpec) *mlxserving.Server {
	t.Helper()
	srv, err := mlxserving.New(e)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.LoadModel(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	return srv
}

// structuredDoc generates a document of schema through srv (model
// "tiny", prompt i) and checks that it ends with "stop" and validates.
func structuredDoc(t *testing.T, srv *mlxserving.Server, schema string, i int, sp engine.SamplingParams) string {
	t.Helper()
	p := api.Params{MaxTokens: 300, JSONSchema: []byte(schema), Sampling: sp}
	st, err := srv.Generate(context.Background(), api.Request{Model: "tiny", Prompt: fmt.Sprintf("Give me JSON %d:", i), Params: p})
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if res.Finish != api.FinishStop {
		t.Fatalf("schema %d %+v: finish %q after %d tokens: %q", i, sp, res.Finish, len(res.Tokens), res.Text)
	}
	validate(t, schema, res.Text)
	return res.Text
}

func validate(t *testing.T, schema, text string) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	val, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%q is not JSON: %v", text, err)
	}
	if err := val.Validate(v); err != nil {
		t.Fatalf("%q does not validate against %s: %v", text, schema, err)
	}
}
