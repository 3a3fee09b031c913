package session_test

import (
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/session"
)

// Two users share a system prompt and name no session: the second reuses
// the first one's saved KV for the shared part.
func ExamplePrefixCache() {
	sim, _ := enginetest.NewSim() // the simulated engine
	defer sim.Close()
	m, _ := sim.Load(context.Background(), engine.ModelSpec{ID: "m"})
	cache, _ := session.NewPrefixCache(m)
	defer cache.Close()

	system := make([]int32, 64)
	for i := range system {
		system[i] = int32(100 + i)
	}
	for user, question := range [][]int32{{7, 8, 9}, {5, 6}} {
		prompt := append(append([]int32(nil), system...), question...)
		id := engine.SeqID(user + 1)
		reused, _ := cache.Open(context.Background(), id, prompt, "")
		_, _ = cache.Step(context.Background(), []engine.StepInput{{Seq: id, Tokens: prompt[reused:], Sample: true, Params: &engine.SamplingParams{}}})
		cache.Free(id, cache.NewKey())
		fmt.Printf("user %d: %d of %d prompt tokens reused\n", user+1, reused, len(prompt))
	}
	// Output:
	// user 1: 0 of 67 prompt tokens reused
	// user 2: 64 of 66 prompt tokens reused
}

func ExampleRegistry() {
	reg, _ := session.New(session.WithMaxSessions(2), session.WithOnEvict(func(s session.Session, why session.Reason) {
		fmt.Printf("%s %s: drop %s\n", s.ID, why, session.Key(s.ID))
	}))
	defer reg.Close()
	for _, id := range []string{"alice", "bob", "alice", "carol"} {
		s, created, _ := reg.Begin(id, "llama")
		fmt.Printf("%s turn %d (new: %v)\n", s.ID, s.Turns, created)
	}
	_, _, err := reg.Begin("bad\nid", "llama")
	fmt.Println(err)
	// Output:
	// alice turn 1 (new: true)
	// bob turn 1 (new: true)
	// alice turn 2 (new: false)
	// bob evicted: drop session:bob
	// carol turn 1 (new: true)
	// invalid session id "bad\nid": control character U+000A
}
