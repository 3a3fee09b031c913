package enginetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// BenchmarkSimStep measures the simulated engine's own CPU cost per Step
// of a decode batch (step time 0), so that serving-layer measurements on
// it can subtract it. One allocation per Step is the output slice.
func BenchmarkSimStep(b *testing.B) {
	for _, batch := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchStep(b, batch) })
	}
}

// reopenEvery bounds how long the benchmark's sequences grow.
const reopenEvery = 4096

func benchStep(b *testing.B, n int) {
	sim, err := NewSim(WithMaxBatch(n), WithContextLength(reopenEvery+64))
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	ctx := context.Background()
	m, err := sim.Load(ctx, engine.ModelSpec{ID: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	params := &engine.SamplingParams{}
	in := make([]engine.StepInput, n)
	toks := make([]int32, n)
	open := func() {
		for i := range in {
			id := engine.SeqID(i)
			m.Free(id, "")
			toks[i] = int32(i + 1)
			if _, err := m.Open(ctx, id, toks[i:i+1], ""); err != nil {
				b.Fatal(err)
			}
			in[i] = engine.StepInput{Seq: id, Tokens: toks[i : i+1], Sample: true, Params: params}
		}
	}
	open()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i%reopenEvery == reopenEvery-1 {
			b.StopTimer()
			open()
			b.StartTimer()
		}
		out, err := m.Step(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		for j := range out {
			toks[j] = out[j].Token
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
}
