package redisaffinity_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/redisaffinity"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// BenchmarkStickiness measures how well sessions stay on their home
// instance (where their KV cache is) through a balancer sharing homes in
// a real Redis: 16 conversations of 8 turns each over 3 instances on the
// simulated engine (2 ms steps, 4 sequences a step), idle and with 12
// background clients sending session-less requests. Reported: at-home,
// the share of turns after the first served where the first was; kept,
// the conversations whose every turn stayed home.
//
//	go test -run '^$' -bench Stickiness -benchtime 1x -count 6 ./balancer/redisaffinity
func BenchmarkStickiness(b *testing.B) {
	for _, background := range []int{0, 12} {
		name := "idle"
		if background > 0 {
			name = "load"
		}
		b.Run(name, func(b *testing.B) {
			r := startRedis(b)
			store, err := redisaffinity.New(client(b, r), redisaffinity.WithPrefix("bench:"))
			if err != nil {
				b.Fatal(err)
			}
			srvs := servers(b, 3, enginetest.WithStepTime(2*time.Millisecond, 0), enginetest.WithMaxBatch(4))
			lb, err := balancer.New(balancer.WithAffinityStore(store, time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			defer lb.Close()
			for i, s := range srvs {
				if err := lb.Add(fmt.Sprintf("n%d", i+1), s); err != nil {
					b.Fatal(err)
				}
			}
			ask := func(session string, n int) (string, error) {
				st, err := lb.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "hello " + session,
					Params: api.Params{MaxTokens: n, IgnoreEOS: true, Session: session}})
				if err != nil {
					return "", err
				}
				defer st.Close()
				if _, err := st.Collect(); err != nil {
					return "", err
				}
				return st.Header().Backend, nil
			}
			var home, turns, kept, sessions int
			for b.Loop() {
				stop := make(chan struct{})
				var bg sync.WaitGroup
				for range background {
					bg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							_, _ = ask("", 24)
						}
					})
				}
				var mu sync.Mutex
				var wg sync.WaitGroup
				for s := range 16 {
					session := fmt.Sprintf("s%d-%d", s, time.Now().UnixNano())
					wg.Go(func() {
						first, err := ask(session, 8)
						if err != nil {
							b.Error(err)
							return
						}
						stayed := true
						for range 7 {
							got, err := ask(session, 8)
							if err != nil {
								b.Error(err)
								return
							}
							mu.Lock()
							turns++
							if got == first {
								home++
							} else {
								stayed = false
							}
							mu.Unlock()
						}
						mu.Lock()
						sessions++
						if stayed {
							kept++
						}
						mu.Unlock()
					})
				}
				wg.Wait()
				close(stop)
				bg.Wait()
			}
			b.ReportMetric(float64(home)/float64(turns), "at-home")
			b.ReportMetric(float64(kept)/float64(sessions)*16, "kept/16")
		})
	}
}
