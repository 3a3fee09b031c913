//go:build mlx

package mlx

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// refKeep is the set of tokens temperature, top-k, top-p and min-p keep,
// computed on the host by sorting, as the engine contract describes.
func refKeep(row []float32, p *engine.SamplingParams) []bool {
	v := len(row)
	l := make([]float64, v)
	for i, x := range row {
		l[i] = float64(x / p.Temperature)
	}
	order := make([]int, v)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case l[a] > l[b]:
			return -1
		case l[a] < l[b]:
			return 1
		}
		return 0
	})
	keep := make([]bool, v)
	n := v
	if p.TopK > 0 && p.TopK < v {
		n = p.TopK
	}
	softmax := func(m int) []float64 { // over the first m of order
		out := make([]float64, m)
		var z float64
		for j := range m {
			out[j] = math.Exp(l[order[j]] - l[order[0]])
			z += out[j]
		}
		for j := range out {
			out[j] /= z
		}
		return out
	}
	if p.TopP > 0 && p.TopP < 1 {
		probs := softmax(n)
		before := 0.0
		for j := range n {
			if before >= float64(p.TopP) {
				n = j
				break
			}
			before += probs[j]
		}
	}
	probs := softmax(n)
	for j := range n {
		keep[order[j]] = probs[j] >= probs[0]*float64(p.MinP)
	}
	return keep
}

// TestFilterMatchesSort checks the device's top-k, top-p and min-p
// thresholds, for a batch of rows with different parameters, against
// sorting on the host.
func TestFilterMatchesSort(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	r := rand.New(rand.NewPCG(1, 2))
	// The first batch bisects for top-p (rows without top-k); in the
	// second every top-p row has a top-k, which sorts its candidates.
	for _, params := range [][]*engine.SamplingParams{{
		{Temperature: 1, TopK: 5},
		{Temperature: 0.7, TopP: 0.5},
		{Temperature: 1.3, TopP: 0.95},
		{Temperature: 1, MinP: 0.05},
		{Temperature: 0.9, TopK: 40, TopP: 0.8, MinP: 0.02},
		{Temperature: 2, TopK: 1},
		{Temperature: 1},
		{Temperature: 0.5, TopP: 0.999},
	}, {
		{Temperature: 1, TopK: 5, TopP: 0.6},
		{Temperature: 0.8, TopK: 50, TopP: 0.9},
		{Temperature: 1.5, TopK: 300, TopP: 0.95, MinP: 0.01},
		{Temperature: 1, TopK: 20},
		{Temperature: 1},
	}} {
		checkFilter(t, m, r, params)
	}
}

func checkFilter(t *testing.T, m *model, r *rand.Rand, params []*engine.SamplingParams) {
	t.Helper()
	v := m.cfg.Vocab
	rows := make([]float32, len(params)*v)
	for i := range rows {
		rows[i] = float32(r.NormFloat64() * 3)
	}
	var got []float32
	err := m.call(func(g *graph) error {
		l := m.filter(g, g.float32s(rows, len(params), v), params)
		g.eval(l)
		if g.err != nil {
			return g.err
		}
		var err error
		got, err = readFloat32s(l)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range params {
		want := refKeep(rows[i*v:(i+1)*v], p)
		kept, diff := 0, 0
		for j := range v {
			k := !math.IsInf(float64(got[i*v+j]), -1)
			if k {
				kept++
			}
			if k != want[j] {
				diff++
			}
		}
		if diff > 0 || kept == 0 {
			t.Errorf("row %d %+v: keeps %d tokens, %d differ from sorting", i, *p, kept, diff)
		}
	}
}

// TestDrawFollowsProbabilities draws many times from one small
// distribution (one sequence, successive positions) and compares the
// frequencies with the probabilities.
func TestDrawFollowsProbabilities(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	v := m.cfg.Vocab
	row := make([]float32, v)
	for i := range row {
		row[i] = -20
	}
	logits := []float32{2, 1.5, 1, 0, -1}
	copy(row, logits)
	p := &engine.SamplingParams{Temperature: 1, TopK: 4, Seed: 3, HasSeed: true}
	s := &seqState{}
	const n = 4000
	counts := make([]int, v)
	err := m.call(func(g *graph) error {
		for range n {
			x := g.float32s(row, 1, v)
			tok := m.draw(g, x, []feed{{seq: s, sample: true}}, []*engine.SamplingParams{p})
			g.eval(tok)
			if g.err != nil {
				return g.err
			}
			ts, err := readInt32s(tok)
			if err != nil {
				return err
			}
			counts[ts[0]]++
			s.drawn++
			g.release()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var z float64
	for _, l := range logits[:4] {
		z += math.Exp(float64(l))
	}
	for j := range v {
		want := 0.0
		if j < 4 {
			want = math.Exp(float64(logits[j])) / z
		}
		if got := float64(counts[j]) / n; math.Abs(got-want) > 0.03 {
			t.Errorf("token %d drawn %.3f of the time, probability %.3f", j, got, want)
		}
	}
}

// TestResumeStartsAtGenerated: the model reports Info.Resumes, and a
// sequence's first sample starts its draws at SamplingParams.Generated
// (at most its length) and counts the prompt's last Generated tokens,
// this step's included, only when a presence or frequency penalty asks.
func TestResumeStartsAtGenerated(t *testing.T) {
	if m := load(t, newEngine(t), tinyDir(t, nil)); !m.Info().Resumes {
		t.Fatal("Info.Resumes is false")
	}
	pen := engine.SamplingParams{Temperature: 1, PresencePenalty: 0.5}
	cases := []struct {
		gen       int
		p         engine.SamplingParams
		drawn     int
		generated []int32
	}{
		{0, pen, 0, nil},
		{1, pen, 1, []int32{14}},
		{3, pen, 3, []int32{12, 13, 14}},
		{4, pen, 4, []int32{11, 12, 13, 14}},
		{9, pen, 5, []int32{10, 11, 12, 13, 14}},
		{3, engine.SamplingParams{Temperature: 1}, 3, nil},
	}
	for _, c := range cases {
		s := &seqState{tokens: []int32{10, 11, 12}}
		p := c.p
		p.Generated = c.gen
		got := s.resume([]int32{13, 14}, &p)
		if s.drawn != c.drawn || !slices.Equal(got, c.generated) {
			t.Errorf("Generated %d (%+v): drawn %d, counted %v; want %d, %v", c.gen, c.p, s.drawn, got, c.drawn, c.generated)
		}
	}
}

// drawKey's keys are pinned, so a seeded request draws the same tokens
// across releases.
func TestDrawKeyPinned(t *testing.T) {
	for _, c := range []struct {
		seed   uint64
		pos    int
		k0, k1 uint32
	}{
		{0, 0, 0x7b1dcdaf, 0xe220a839},
		{42, 7, 0x9e9e2fa4, 0xccf635ee},
		{1<<63 + 5, 1000, 0x29fb52b2, 0x7af616cb},
	} {
		if k0, k1 := drawKey(c.seed, c.pos); k0 != c.k0 || k1 != c.k1 {
			t.Errorf("drawKey(%d, %d) = %#x, %#x; want %#x, %#x", c.seed, c.pos, k0, k1, c.k0, c.k1)
		}
	}
}
