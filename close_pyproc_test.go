package mlxserving_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/grammar"
	"github.com/mlxserving/mlxserving/testmodel"
)

// closeSchema generates a random schema of the structured-outputs subset:
// objects with required and optional properties, arrays with and without
// maxItems, anyOf, strings with lengths, patterns and formats, bounded
// numbers, enums, consts, booleans, nulls, $defs references and maps. A
// smaller cousin of engine/grammar's randSchema (which its _test files
// keep).
func closeSchema(rng *rand.Rand, depth int, defs map[string]any) map[string]any {
	k := rng.IntN(12)
	if depth >= 2 && k < 4 {
		k += 4
	}
	switch k {
	case 0, 1:
		props := map[string]any{}
		var req []any
		for i := range 1 + rng.IntN(3) {
			name := fmt.Sprintf("p%d_%s", i, []string{"a", "é", "q\"", "x y"}[rng.IntN(4)])
			props[name] = closeSchema(rng, depth+1, defs)
			if rng.IntN(2) == 0 {
				req = append(req, name)
			}
		}
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(req) > 0 {
			s["required"] = req
		}
		return s
	case 2:
		lo := rng.IntN(3)
		s := map[string]any{"type": "array", "items": closeSchema(rng, depth+1, defs), "minItems": lo}
		if rng.IntN(2) == 0 {
			s["maxItems"] = lo + rng.IntN(3)
		}
		return s
	case 3:
		var alts []any
		for range 2 + rng.IntN(2) {
			alts = append(alts, closeSchema(rng, depth+1, defs))
		}
		return map[string]any{"anyOf": alts}
	case 4:
		s := map[string]any{"type": "string"}
		switch rng.IntN(5) {
		case 0:
			lo := rng.IntN(4)
			s["minLength"], s["maxLength"] = lo, lo+rng.IntN(6)
		case 1:
			s["pattern"] = []string{"^[a-c]+$", "^x[0-9]{2,3}$", "ab", "^(yes|no)$", "^é.$"}[rng.IntN(5)]
		case 2:
			s["format"] = []string{"date", "date-time", "uuid", "email", "ipv4", "time"}[rng.IntN(6)]
		}
		return s
	case 5:
		s := map[string]any{"type": []string{"integer", "number"}[rng.IntN(2)]}
		if rng.IntN(2) == 0 {
			lo := rng.IntN(200) - 100
			s["minimum"], s["maximum"] = lo, lo+rng.IntN(50)
		}
		return s
	case 6:
		return map[string]any{"enum": []any{"a", 1.5, nil, true, []any{1, "x"}, "line\nbreak"}[:1+rng.IntN(6)]}
	case 7:
		return map[string]any{"const": map[string]any{"k": []any{1, "é"}}}
	case 8:
		return map[string]any{"type": []string{"boolean", "null"}[rng.IntN(2)]}
	case 9:
		name := fmt.Sprintf("d%d", len(defs))
		defs[name] = true // reserved: nested definitions get other names
		defs[name] = closeSchema(rng, depth+1, defs)
		return map[string]any{"$ref": "#/$defs/" + name}
	case 10:
		return map[string]any{"type": "object", "additionalProperties": closeSchema(rng, depth+1, defs), "maxProperties": 1 + rng.IntN(3)}
	}
	return map[string]any{}
}

// closeCase is one request of TestPyprocCloseWithinMaxTokens and what
// came of it.
type closeCase struct {
	schema    string
	val       *jsonschema.Schema
	min       int // the schema's shortest document, from the 400
	maxTokens int
	seed      uint64

	res  api.Result
	err  error
	fail string
}

// TestPyprocCloseWithinMaxTokens: the property of issue 38 on a real
// engine. The torch engine runs the generated test model (random weights,
// so only the mask makes its output JSON) on random schemas; each
// schema's minimum is read from the 400 that max_tokens 1 gets (and
// max_tokens one below it is refused too), and the schema is asked for
// with max_tokens at its minimum and at a random budget up to 40 above,
// with jump-forward decoding on and off. Every reply parses, validates
// against its schema and takes at most max_tokens; one whose budget
// restricted its mask (Usage.ClosingTokens) ends with "length", one that
// the budget did not touch with "stop".
func TestPyprocCloseWithinMaxTokens(t *testing.T) {
	testCloseWithinMaxTokens(t, pythonEngine(t, 1))
}

// testCloseWithinMaxTokens is TestPyprocCloseWithinMaxTokens on engine e
// (close_mlx_test.go runs it on the MLX engine).
func testCloseWithinMaxTokens(t *testing.T, e engine.Engine) {
	schemas := 48
	if testing.Short() {
		schemas = 12
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	lim := grammar.Limits{MaxStringLength: 24, MaxItems: 4, MaxProperties: 4, MaxValues: 40}
	ctx := context.Background()
	for _, jump := range []bool{true, false} {
		t.Run(fmt.Sprintf("jump=%v", jump), func(t *testing.T) {
			srv, err := mlxserving.New(e, mlxserving.WithGrammarLimits(lim), mlxserving.WithBatcherOptions(batcher.WithJumpForward(jump)))
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			id := fmt.Sprintf("tiny-jump-%v", jump)
			if err := srv.LoadModel(ctx, engine.ModelSpec{ID: id, Path: dir}); err != nil {
				t.Fatal(err)
			}
			req := func(c *closeCase, maxTokens int) api.Request {
				return api.Request{Model: id, Prompt: "JSON:", Params: api.Params{MaxTokens: maxTokens, JSONSchema: []byte(c.schema),
					Sampling: engine.SamplingParams{Temperature: 1, Seed: c.seed, HasSeed: true}}}
			}
			// minimum asks with max_tokens n: 0 when accepted (the stream
			// is drained), else the minimum the 400 names.
			minimum := func(c *closeCase, n int) int {
				st, err := srv.Generate(ctx, req(c, n))
				if err == nil {
					if _, err := st.Collect(); err != nil {
						t.Fatalf("schema %s, max_tokens %d: %v", c.schema, n, err)
					}
					return 0
				}
				var ip *engine.InvalidParamError
				var be *grammar.BudgetError
				if !errors.As(err, &ip) || ip.Param != "max_tokens" || !errors.As(err, &be) || be.Budget != n || be.MinTokens <= n {
					t.Fatalf("schema %s, max_tokens %d: %v; want an InvalidParamError on max_tokens wrapping a BudgetError", c.schema, n, err)
				}
				return be.MinTokens
			}

			rng := rand.New(rand.NewPCG(38, 38))
			var cases []*closeCase
			for i := range schemas {
				defs := map[string]any{}
				s := closeSchema(rng, 0, defs)
				if len(defs) > 0 {
					s = map[string]any{"$defs": defs, "anyOf": []any{s}}
				}
				raw, _ := json.Marshal(s)
				c := &closeCase{schema: string(raw), val: closeValidator(t, string(raw)), seed: uint64(i)}
				c.min = max(1, minimum(c, 1))
				if c.min > 2 && minimum(c, c.min-1) != c.min {
					t.Fatalf("schema %s: max_tokens %d and 1 name different minimums", c.schema, c.min-1)
				}
				for _, budget := range []int{c.min, c.min + 1 + rng.IntN(40)} {
					cc := *c
					cc.maxTokens, cc.seed = budget, c.seed*1000+uint64(budget)
					cases = append(cases, &cc)
				}
			}

			var wg sync.WaitGroup
			for _, c := range cases {
				wg.Go(func() {
					st, err := srv.Generate(ctx, req(c, c.maxTokens))
					if err == nil {
						c.res, err = st.Collect()
					}
					c.err = err
				})
			}
			wg.Wait()

			var closed, forced, fails int
			var table strings.Builder
			for _, c := range cases {
				c.fail = checkClose(c, jump)
				if c.res.Usage.ClosingTokens > 0 {
					closed++
				}
				forced += c.res.Usage.ForcedTokens
				if c.fail != "" {
					fails++
					fmt.Fprintf(&table, "\n  schema %s\n    min %d, max_tokens %d, seed %d: %s\n    finish %q, tokens %d (closing %d, forced %d), reply %q",
						c.schema, c.min, c.maxTokens, c.seed, c.fail, c.res.Finish, c.res.Usage.CompletionTokens,
						c.res.Usage.ClosingTokens, c.res.Usage.ForcedTokens, c.res.Text)
				}
			}
			if fails > 0 {
				t.Errorf("%d of %d replies fail:%s", fails, len(cases), table.String())
			}
			if jump && forced == 0 {
				t.Errorf("jump-forward on: no reply had forced tokens")
			}
			if closed == 0 {
				t.Errorf("no reply was closed by its budget")
			}
			t.Logf("%d replies on %d schemas: %d closed by their budget, %d forced tokens", len(cases), schemas, closed, forced)
		})
	}
}

// checkClose says what is wrong with c's reply, or "".
func checkClose(c *closeCase, jump bool) string {
	r := c.res
	switch {
	case c.err != nil:
		return c.err.Error()
	case !utf8.ValidString(r.Text):
		return "not UTF-8"
	case !json.Valid([]byte(r.Text)):
		return "not JSON"
	case r.Usage.CompletionTokens > c.maxTokens || len(r.Tokens) > c.maxTokens:
		return fmt.Sprintf("%d tokens (%d streamed), more than max_tokens", r.Usage.CompletionTokens, len(r.Tokens))
	case r.Usage.ClosingTokens > r.Usage.CompletionTokens:
		return "more closing tokens than tokens"
	case r.Usage.ClosingTokens > 0 && r.Finish != api.FinishLength:
		return "closed by the budget, but finish is not length"
	case r.Usage.ClosingTokens == 0 && r.Finish != api.FinishStop && r.Usage.CompletionTokens < c.maxTokens:
		return "finished before the budget, but not with stop"
	case !jump && r.Usage.ForcedTokens > 0:
		return "forced tokens with jump-forward off"
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(r.Text)))
	if err != nil {
		return err.Error()
	}
	if err := c.val.Validate(v); err != nil {
		return "does not validate: " + strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	return ""
}

// closeValidator compiles schema with format assertions on.
func closeValidator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("compile %s: %v", schema, err)
	}
	return s
}
