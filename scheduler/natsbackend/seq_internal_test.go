package natsbackend

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler/natsbackend/natstest"
)

// TestLostStreamMessages: a stream whose numbered chunk messages arrive
// with a gap, or whose heartbeat counts more messages than arrived, ends
// with ErrInstanceLost (interrupted once text was delivered) instead of
// going on without the missing text; in order, or from an instance that
// numbers nothing, it reads to its end.
func TestLostStreamMessages(t *testing.T) {
	nc, err := nats.Connect(natstest.Start(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tok := func(finish string) string {
		if finish != "" {
			return `[{"t":"b","k":2,"h":true,"f":"` + finish + `"}]`
		}
		return `[{"t":"a","k":1,"h":true}]`
	}
	for _, tc := range []struct {
		name string
		msgs []string
		lost bool
	}{
		{"in order", []string{"c0" + tok(""), "h1", "c1" + tok("length")}, false},
		{"unnumbered", []string{"c" + tok(""), "h", "c" + tok("length")}, false},
		{"gap", []string{"c0" + tok(""), "c2" + tok("length")}, true},
		{"heartbeat ahead", []string{"c0" + tok(""), "h2"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{nc: nc, instance: "a", cfg: clientConfig{window: 256, heartbeat: time.Second}, lost: make(chan struct{})}
			inbox := nc.NewInbox()
			ch := make(chan *nats.Msg, 16)
			sub, err := nc.ChanSubscribe(inbox, ch)
			if err != nil {
				t.Fatal(err)
			}
			s := &clientStream{c: c, sub: sub, ch: ch, control: nc.NewInbox(), closed: make(chan struct{}), timer: time.NewTimer(time.Hour)}
			defer s.Close(nil)
			for _, m := range tc.msgs {
				if err := nc.Publish(inbox, []byte(m)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Recv(context.Background()); err != nil {
				t.Fatalf("first chunk: %v", err)
			}
			_, err = s.Recv(context.Background())
			if !tc.lost {
				if err != nil {
					t.Fatalf("second chunk: %v", err)
				}
				if _, err := s.Recv(context.Background()); !errors.Is(err, io.EOF) {
					t.Fatalf("after the final chunk: %v, want io.EOF", err)
				}
				return
			}
			var ie *retry.InterruptedError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInstanceLost) {
				t.Fatalf("after a lost message: %v, want an InterruptedError wrapping ErrInstanceLost", err)
			}
		})
	}
}
