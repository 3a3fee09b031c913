package mlxserving_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/session"
)

// run generates to the end, failing t on any error.
func run(t *testing.T, srv *mlxserving.Server, r api.Request) (api.Result, api.Header) {
	t.Helper()
	st, err := srv.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	return res, st.Header()
}

func seq(start, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((start + i*37) % 383)
	}
	return out
}

// TestSessionTemplateBoundary: a session's next turn whose prompt renders
// the previous answer differently (the last generated token replaced by an
// end-of-turn marker) reuses everything before the difference.
func TestSessionTemplateBoundary(t *testing.T) {
	f := newFixture(t, nil)
	turn1 := seq(1, 40)
	r := req(6, turn1...)
	r.Session = "conv"
	res1, hdr := run(t, f.srv, r)
	if hdr.Session != "conv" {
		t.Fatalf("Header().Session %q", hdr.Session)
	}
	shared := append(slices.Clone(turn1), res1.Tokens[:4]...)
	turn2 := append(append(slices.Clone(shared), 996, 995), seq(500, 10)...)
	r2 := req(4, turn2...)
	r2.Session = "conv"
	res2, _ := run(t, f.srv, r2)
	if res2.Usage.CachedTokens != len(shared) {
		t.Fatalf("turn 2 reused %d tokens; it shares %d with turn 1", res2.Usage.CachedTokens, len(shared))
	}
	plain, err := mlxserving.New(f.sim, mlxserving.WithoutPrefixCache())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.LoadModel(context.Background(), engine.ModelSpec{ID: "sim"}); err != nil {
		t.Fatal(err)
	}
	if want, _ := run(t, plain, req(4, turn2...)); !slices.Equal(want.Tokens, res2.Tokens) || want.Usage.CachedTokens != 0 {
		t.Fatalf("turn 2 gave %v with reuse and %v (cached %d) without", res2.Tokens, want.Tokens, want.Usage.CachedTokens)
	}
	if st := f.srv.SessionStats(); st.Created != 1 || st.Resumed != 1 {
		t.Fatalf("session stats %+v", st)
	}
}

// TestSharedSystemPromptWithoutSessions: requests naming no session reuse
// a system prompt an earlier request saved.
func TestSharedSystemPromptWithoutSessions(t *testing.T) {
	f := newFixture(t, nil)
	system := seq(3, 100)
	for u := range 6 {
		res, hdr := run(t, f.srv, req(3, append(slices.Clone(system), seq(600+u*11, 5+u)...)...))
		if hdr.Session != "" {
			t.Fatalf("a request without a session got session %q", hdr.Session)
		}
		if u > 0 && res.Usage.CachedTokens < len(system) {
			t.Fatalf("user %d reused %d tokens; the system prompt has %d", u, res.Usage.CachedTokens, len(system))
		}
	}
	pc := f.srv.Stats()["sim"].PrefixCache
	if pc.Hits < 5*100 || pc.LookupHits != 5 || pc.Queries < 6*100 {
		t.Fatalf("prefix cache stats %+v", pc)
	}
}

// TestNewSessionMintsID: NewSession gets a minted id back, and the next
// request naming it resumes it.
func TestNewSessionMintsID(t *testing.T) {
	f := newFixture(t, nil)
	r := req(3, seq(5, 30)...)
	r.NewSession = true
	res, hdr := run(t, f.srv, r)
	if err := session.ValidateID(hdr.Session); err != nil || len(hdr.Session) != 36 {
		t.Fatalf("minted id %q: %v", hdr.Session, err)
	}
	r2 := req(3, append(append(seq(5, 30), res.Tokens[:2]...), 7, 8)...)
	r2.Session = hdr.Session
	if res2, _ := run(t, f.srv, r2); res2.Usage.CachedTokens != 32 {
		t.Fatalf("the minted session's next turn reused %d tokens, want 32", res2.Usage.CachedTokens)
	}
	if s, ok := f.srv.Session(hdr.Session); !ok || s.Turns != 2 || s.Model != "sim" {
		t.Fatalf("session %+v %v", s, ok)
	}
}

// TestBadSessionIDs are refused with a typed error; the server keeps
// serving.
func TestBadSessionIDs(t *testing.T) {
	f := newFixture(t, nil)
	for _, id := range []string{"a\x00b", "line\nbreak", string(make([]byte, 129))} {
		r := req(2, 1, 2, 3)
		r.Session = id
		_, err := f.srv.Generate(context.Background(), r)
		if !errors.Is(err, session.ErrInvalidID) || !errors.Is(err, engine.ErrInvalidParam) {
			t.Fatalf("session id %q: %v; want session.ErrInvalidID", id, err)
		}
	}
	run(t, f.srv, req(2, 1, 2, 3))
}

// TestExpiredSessionStartsFresh: an expired session id is a new session,
// its old KV dropped; never an error.
func TestExpiredSessionStartsFresh(t *testing.T) {
	f := newFixture(t, nil, mlxserving.WithSessionOptions(session.WithTTL(30*time.Millisecond)))
	r := req(3, seq(7, 30)...)
	r.Session = "old"
	res, _ := run(t, f.srv, r)
	waitFor(t, "the session to expire", func() bool { return f.srv.SessionStats().Expired == 1 })
	r2 := req(3, append(append(seq(7, 30), res.Tokens...), 1)...)
	r2.Session = "old"
	res2, _ := run(t, f.srv, r2)
	if res2.Usage.CachedTokens != 0 {
		t.Fatalf("an expired session reused %d tokens of dropped KV", res2.Usage.CachedTokens)
	}
	if st := f.srv.SessionStats(); st.Created != 2 {
		t.Fatalf("session stats %+v; want the id created twice", st)
	}
}

// TestConcurrentTurnsOfOneSession: requests of one session at once all
// complete with the tokens they get alone; a later one reuses a finished
// one's KV, never an unfinished one's.
func TestConcurrentTurnsOfOneSession(t *testing.T) {
	f := newFixture(t, nil)
	base := seq(9, 50)
	want := make([][]int32, 8)
	for i := range want {
		res, _ := run(t, f.srv, req(5, append(slices.Clone(base), int32(i))...))
		want[i] = res.Tokens
	}
	var wg sync.WaitGroup
	for round := range 3 {
		for i := range want {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := req(5, append(slices.Clone(base), int32(i))...)
				r.Session = "shared"
				st, err := f.srv.Generate(context.Background(), r)
				if err != nil {
					t.Error(err)
					return
				}
				res, err := st.Collect()
				if err != nil {
					t.Error(err)
					return
				}
				if !slices.Equal(res.Tokens, want[i]) {
					t.Errorf("round %d, request %d: %v; alone %v", round, i, res.Tokens, want[i])
				}
				if res.Usage.CachedTokens > len(base)+1 {
					t.Errorf("request %d reused %d tokens of a %d-token prompt", i, res.Usage.CachedTokens, len(base)+1)
				}
			}()
		}
		wg.Wait()
	}
}

// TestMintedSessionsMerge: with request merging on, requests that only ask
// for a minted session still merge; each gets its own id, and the
// leader's id holds the generation's KV for its next turn.
func TestMintedSessionsMerge(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)}, mlxserving.WithMerging())
	r := req(20, seq(13, 30)...)
	r.NewSession = true
	var streams []*api.Stream
	for range 4 {
		st, err := f.srv.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	ids := map[string]bool{}
	leader := ""
	var res api.Result
	for _, st := range streams {
		got, err := st.Collect()
		if err != nil {
			t.Fatal(err)
		}
		h := st.Header()
		ids[h.Session] = true
		if h.Cache == "miss" {
			leader, res = h.Session, got
		}
	}
	if len(ids) != 4 || leader == "" {
		t.Fatalf("sessions %v, leader %q: want 4 distinct ids and one miss", ids, leader)
	}
	if s := f.sim.Stats(); s.Sampled != 20 {
		t.Fatalf("%d tokens sampled for 4 merged requests of 20", s.Sampled)
	}
	next := req(3, append(append(seq(13, 30), res.Tokens[:5]...), 1, 2)...)
	next.Session = leader
	if got, _ := run(t, f.srv, next); got.Usage.CachedTokens != 35 {
		t.Fatalf("the leader's next turn reused %d tokens, want 35", got.Usage.CachedTokens)
	}
}
