package openai_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestChoicesDisconnect: a client that drops an n-choice stream after the
// first event frees every choice's sequence (goleak checks the handler's
// readers at the end of the package).
func TestChoicesDisconnect(t *testing.T) {
	f := newFixture(t, fixtureOpts{sim: []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)}})
	body, _ := json.Marshal(chatBody(map[string]any{"n": 4, "stream": true, "max_tokens": 400, "ignore_eos": true, "temperature": 1}))
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.ts.URL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	indexes := map[string]bool{}
	for len(indexes) < 4 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if i := strings.Index(line, `"index":`); i >= 0 {
			indexes[line[i:i+9]] = true
		}
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "every choice's sequence freed", func() bool { return f.sim.Stats().OpenSequences == 0 })
}
