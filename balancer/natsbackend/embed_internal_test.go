package natsbackend

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/api"
)

// TestEmbedParts: vectors go in parts no larger than the limit, and the
// parts put together are the vectors bit for bit (NaN, infinities and
// negative zero included), in whatever order they arrive.
func TestEmbedParts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ inputs, dim, limit int }{{1, 8, 1 << 20}, {300, 1024, 32 << 10}, {2048, 1024, 1 << 20}, {5, 3000, 16100}, {0, 0, 1 << 10}} {
		res := &api.Embeddings{Model: "m", PromptTokens: 77, Cached: 3, Duration: 5}
		for range tc.inputs {
			v := make([]float32, tc.dim)
			for j := range v {
				v[j] = r.Float32()*2 - 1
			}
			res.Vectors = append(res.Vectors, v)
		}
		if tc.inputs > 0 {
			res.Vectors[0][0] = float32(math.NaN())
			res.Vectors[0][1] = float32(math.Inf(-1))
			res.Vectors[0][2] = float32(math.Copysign(0, -1))
		}
		parts, err := embedParts(res, tc.limit)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		if want := (tc.inputs*tc.dim*4 + tc.limit - 1) / tc.limit; len(parts) < want {
			t.Errorf("%+v: %d parts, want at least %d", tc, len(parts), want)
		}
		a := &embedAssembly{instance: "i", res: &api.Embeddings{Vectors: make([][]float32, tc.inputs)}, left: tc.inputs}
		slices.Reverse(parts)
		for _, p := range parts {
			if len(p) > tc.limit {
				t.Fatalf("%+v: a part of %d bytes", tc, len(p))
			}
			if err := a.add(&nats.Msg{Data: p}); err != nil {
				t.Fatal(err)
			}
		}
		if !a.complete() || a.res.Model != "m" || a.res.PromptTokens != 77 || a.res.Cached != 3 || a.res.Duration != 5 {
			t.Fatalf("%+v: put together %+v (complete %v)", tc, a.res, a.complete())
		}
		for i, v := range res.Vectors {
			for j, x := range v {
				if got := a.res.Vectors[i][j]; math.Float32bits(got) != math.Float32bits(x) {
					t.Fatalf("%+v: vector %d value %d is %v, want %v", tc, i, j, got, x)
				}
			}
		}
		if tc.inputs > 0 {
			if err := a.add(&nats.Msg{Data: parts[0]}); !errors.Is(err, ErrProtocol) {
				t.Errorf("a part twice: %v", err)
			}
		}
	}
	// Vectors of another width start another part; a part cut short is
	// refused.
	mixed := &api.Embeddings{Vectors: [][]float32{{1, 2}, {3, 4}, {5, 6, 7}, {8, 9}}}
	parts, err := embedParts(mixed, 1<<20)
	if err != nil || len(parts) != 3 {
		t.Fatalf("widths 2, 2, 3, 2: %d parts, %v", len(parts), err)
	}
	a := &embedAssembly{instance: "i", res: &api.Embeddings{Vectors: make([][]float32, 4)}, left: 4}
	if err := a.add(&nats.Msg{Data: parts[0][:len(parts[0])-1]}); !errors.Is(err, ErrProtocol) {
		t.Errorf("a part cut short: %v", err)
	}
	for _, p := range parts {
		if err := a.add(&nats.Msg{Data: p}); err != nil {
			t.Fatal(err)
		}
	}
	for i, v := range mixed.Vectors {
		if !a.complete() || !slices.Equal(a.res.Vectors[i], v) {
			t.Fatalf("widths 2, 2, 3, 2 put together: %v", a.res.Vectors)
		}
	}
	if _, err := embedParts(&api.Embeddings{Vectors: [][]float32{make([]float32, 1000)}}, 1000); err == nil {
		t.Error("a vector larger than the max_payload was encoded")
	}
}

// TestSplitEmbed: a request over the budget goes as requests of
// consecutive inputs that each fit; one that fits goes whole.
func TestSplitEmbed(t *testing.T) {
	req := api.EmbedRequest{Model: "m", Dimensions: 8, Truncate: true, Client: "c"}
	for i := range 500 {
		if i%2 == 0 {
			req.Inputs = append(req.Inputs, api.EmbedInput{Text: strings.Repeat("ab ", 10+i%40)})
		} else {
			req.Inputs = append(req.Inputs, api.EmbedInput{Tokens: []int32{1, 2, int32(i)}})
		}
	}
	whole, err := splitEmbed(req, 1<<20)
	if err != nil || len(whole) != 1 || whole[0].n != 500 {
		t.Fatalf("under the budget: %d groups, %v", len(whole), err)
	}
	const budget = 4000
	groups, err := splitEmbed(req, budget)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) < 2 {
		t.Fatalf("%d groups", len(groups))
	}
	var inputs []api.EmbedInput
	for _, g := range groups {
		if len(g.data) > budget {
			t.Errorf("a request of %d bytes", len(g.data))
		}
		var sub api.EmbedRequest
		if err := json.Unmarshal(g.data, &sub); err != nil {
			t.Fatal(err)
		}
		if sub.Model != "m" || sub.Dimensions != 8 || !sub.Truncate || sub.Client != "c" || len(sub.Inputs) != g.n {
			t.Fatalf("a part's request: %+v", sub)
		}
		inputs = append(inputs, sub.Inputs...)
	}
	if len(inputs) != len(req.Inputs) {
		t.Fatalf("%d inputs over the parts, want %d", len(inputs), len(req.Inputs))
	}
	for i := range inputs {
		if inputs[i].Text != req.Inputs[i].Text || !slices.Equal(inputs[i].Tokens, req.Inputs[i].Tokens) {
			t.Fatalf("input %d: %+v, want %+v", i, inputs[i], req.Inputs[i])
		}
	}

	var ip *api.InvalidParamError
	big := api.EmbedRequest{Model: "m", Inputs: []api.EmbedInput{{Text: "a"}, {Text: strings.Repeat("x", budget)}}}
	if _, err := splitEmbed(big, budget); !errors.As(err, &ip) || ip.Param != "input" {
		t.Errorf("an input over the budget: %v", err)
	}
	many := api.EmbedRequest{Model: "m", Inputs: make([]api.EmbedInput, api.MaxEmbedInputs+1)}
	for i := range many.Inputs {
		many.Inputs[i].Text = "abc"
	}
	if _, err := splitEmbed(many, budget); !errors.As(err, &ip) || ip.Param != "input" {
		t.Errorf("more inputs than a request takes, split: %v", err)
	}
}
