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
	e := newEngine(t)
	srv, err := mlxserving.New(e)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: tiny(t)}); err != nil {
		t.Fatal(err)
	}
	schemas := []string{
		`{"type":"object","properties":{"name":{"type":"string","maxLength":10},"age":{"type":"integer","minimum":0,"maximum":99}},"required":["name","age"],"additionalProperties":false}`,
		`{"type":"array","items":{"enum":["red","green","blue"]},"minItems":1,"maxItems":4}`,
		`{"anyOf":[{"type":"number","minimum":-5,"maximum":5},{"type":"boolean"},{"type":"null"}]}`,
		`{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-f0-9]{4}$"},"tags":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":2},"ok":{"const":true}},"required":["id","tags","ok"]}`,
		`{"$defs":{"p":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"],"additionalProperties":false}},"type":"array","items":{"$ref":"#/$defs/p"},"maxItems":2}`,
	}
	for i, schema := range schemas {
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
		for seed := uint64(0); seed < 3; seed++ {
			p := api.Params{MaxTokens: 300, JSONSchema: []byte(schema),
				Sampling: engine.SamplingParams{Temperature: 1, Seed: seed, HasSeed: true}}
			st, err := srv.Generate(ctx, api.Request{Model: "tiny", Prompt: fmt.Sprintf("Give me JSON %d:", i), Params: p})
			if err != nil {
				t.Fatal(err)
			}
			res, err := st.Collect()
			if err != nil {
				t.Fatal(err)
			}
			if res.Finish != api.FinishStop {
				t.Fatalf("schema %d seed %d: finish %q after %d tokens: %q", i, seed, res.Finish, len(res.Tokens), res.Text)
			}
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(res.Text))
			if err != nil {
				t.Fatalf("schema %d seed %d: %q is not JSON: %v", i, seed, res.Text, err)
			}
			if err := val.Validate(v); err != nil {
				t.Fatalf("schema %d seed %d: %q does not validate: %v", i, seed, res.Text, err)
			}
		}
	}
}
