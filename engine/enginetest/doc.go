// Package enginetest holds what every engine and the serving layer test
// against: [Run], the conformance suite an [engine.Engine] must pass,
// [RunPipeline], the one of models that implement [engine.Pipeliner], and
// [Sim], a simulated engine with deterministic pseudo-tokens, a step-time
// model and real KV accounting, for testing and benchmarking the serving
// layer without a model.
//
// An engine's tests run the suite on a checkpoint directory:
//
//	func TestConformance(t *testing.T) {
//		eng, err := mlx.New()
//		if err != nil { t.Fatal(err) }
//		defer eng.Close()
//		enginetest.Run(t, eng, dir)
//	}
//
// The serving layer's tests run on the simulated engine:
//
//	sim, err := enginetest.NewSim(enginetest.WithStepTime(20*time.Millisecond, 0), enginetest.WithMaxBatch(64))
//	m, err := sim.Load(ctx, engine.ModelSpec{ID: "sim"})
//	... drive m, then check sim.Stats().OpenSequences == 0
//
// The simulated engine's tokens are a pure function of each sequence's
// token history (and the seed when sampling with a temperature), so a batch,
// a chunked prefill and a reused prefix give exactly the tokens of a lone
// full prefill — as the engine contract demands of a real model. A
// sampled draw also mixes in its generated position, so a sequence resumed
// with engine.SamplingParams.Generated draws as the uninterrupted one did
// ([WithoutResume] turns that off); [WithWorkerLoss] fails random steps as
// a crashed worker does.
package enginetest
