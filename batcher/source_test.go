package batcher_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/scheduler"
)

// ended records a Source's End calls.
type ended struct {
	calls int
	usage *api.Usage
	err   error
}

func (e *ended) hook(u *api.Usage, err error) { e.calls, e.usage, e.err = e.calls+1, u, err }

func TestSourceReadsToTheEnd(t *testing.T) {
	r := newRig(t, nil, nil)
	seq := &batcher.Sequence{Prompt: prompt(1, 8), MaxTokens: 5, Params: engine.SamplingParams{TopLogprobs: 2}}
	e := r.submit(t, seq)
	var end ended
	gaps := 0
	src := batcher.NewSource(context.Background(), e, r.queue, batcher.SourceHooks{
		Gap:       func(time.Duration) { gaps++ },
		TokenText: func(id int32) string { return fmt.Sprint("t", id) },
		End:       end.hook,
		Resumed:   2,
	})
	tokens := 0
	for {
		c, err := src.Recv(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if c.HasToken {
			tokens++
			if len(c.Top) == 0 {
				t.Fatal("chunk without its top log-probabilities")
			}
			for _, tl := range c.Top {
				if want := fmt.Sprint("t", tl.Token); tl.Text != want {
					t.Fatalf("top alternative text %q, want %q", tl.Text, want)
				}
			}
		}
	}
	if tokens != 5 || gaps != 4 {
		t.Fatalf("%d tokens and %d gaps, want 5 and 4", tokens, gaps)
	}
	if end.calls != 1 || end.err != nil || end.usage == nil {
		t.Fatalf("End called %d times with %v, %v; want once with the usage", end.calls, end.usage, end.err)
	}
	// The two resumed tokens move from the prompt to the completion.
	if end.usage.PromptTokens != 6 || end.usage.CompletionTokens != 7 {
		t.Fatalf("usage %+v, want 6 prompt and 7 completion tokens", *end.usage)
	}
	src.Close(nil)
}

func TestSourceEndsWithItsContext(t *testing.T) {
	q, err := scheduler.New[*batcher.Sequence]()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	seq := &batcher.Sequence{Prompt: prompt(2, 4), MaxTokens: 3}
	e := &batcher.Entry{Value: seq, Tier: api.Normal, Cost: 7}
	if err := q.Push(e); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	var end ended
	src := batcher.NewSource(ctx, e, q, batcher.SourceHooks{End: end.hook})
	stop := errors.New("caller left")
	cancel(stop)
	// Nothing runs the queue: only the cancellation ends the stream, and
	// it takes the sequence out of the queue.
	_, err = src.Recv(context.Background())
	if !errors.Is(err, stop) {
		t.Fatalf("Recv: %v, want the context's cause", err)
	}
	if q.Remove(e) {
		t.Fatal("the cancelled sequence is still queued")
	}
	if end.calls != 1 || !errors.Is(end.err, stop) {
		t.Fatalf("End called %d times with %v, want once with the cause", end.calls, end.err)
	}
}

func TestSourceRaiseRequeuesAWaitingSequence(t *testing.T) {
	q, err := scheduler.New[*batcher.Sequence]()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	seq := &batcher.Sequence{Prompt: prompt(3, 4), MaxTokens: 3, Tier: api.Low}
	e := &batcher.Entry{Value: seq, Tier: api.Low, Cost: 7}
	if err := q.Push(e); err != nil {
		t.Fatal(err)
	}
	src := batcher.NewSource(context.Background(), e, q, batcher.SourceHooks{})
	defer src.Close(nil)
	src.Raise(api.Normal)
	if e.Tier != api.Normal || seq.Tier != api.Normal {
		t.Fatalf("tiers %v and %v after Raise(Normal), want Normal", e.Tier, seq.Tier)
	}
	src.Raise(api.Low) // a lower tier changes nothing
	if e.Tier != api.Normal {
		t.Fatalf("tier %v after Raise(Low), want Normal kept", e.Tier)
	}
	if !q.Remove(e) {
		t.Fatal("the raised sequence is not queued")
	}
}
