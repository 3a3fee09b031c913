package natsbackend

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/internal/natstest"
	"github.com/mlxserving/mlxserving/retry"
)

// TestLostStreamMessages: a stream whose numbered chunk messages arrive
// with a gap, or whose heartbeat counts more messages than arrived, waits
// for the missing ones to be sent again and reads on; when they do not
// come it ends with ErrInstanceLost (interrupted once text was delivered)
// instead of going on without their text. In order, or from an instance
// that numbers nothing, it reads to its end.
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
		name   string
		msgs   []string
		chunks int // 0: the stream ends lost
	}{
		{"in order", []string{"c0" + tok(""), "h1", "c1" + tok("length")}, 2},
		{"unnumbered", []string{"c" + tok(""), "h", "c" + tok("length")}, 2},
		{"gap replayed", []string{"c0" + tok(""), "c2" + tok("length"), "c1" + tok(""), "c2" + tok("length")}, 3},
		{"replayed twice", []string{"c0" + tok(""), "h2", "c1" + tok(""), "c1" + tok(""), "c2" + tok("length")}, 3},
		{"gap", []string{"c0" + tok(""), "c2" + tok("length")}, 0},
		{"heartbeat ahead", []string{"c0" + tok(""), "h2"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{nc: nc, instance: "a", cfg: clientConfig{window: 256, heartbeat: 50 * time.Millisecond}, lost: make(chan struct{})}
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
			chunks := 0
			for {
				_, err = s.Recv(context.Background())
				if err != nil {
					break
				}
				chunks++
			}
			if tc.chunks > 0 {
				if !errors.Is(err, io.EOF) || chunks != tc.chunks {
					t.Fatalf("%d chunks, then %v; want %d, then io.EOF", chunks, err, tc.chunks)
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
