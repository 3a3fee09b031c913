package tokenizer

import (
	"slices"
	"sync"
	"testing"
)

// TestConcurrentUse runs Encode, Decode, templates and stream decoders
// from several goroutines on one Tokenizer (run with -race).
func TestConcurrentUse(t *testing.T) {
	tok := realTokenizer(t, "qwen3")
	corpus := loadCorpus(t)
	want := map[string][]int32{}
	for k, text := range corpus {
		want[k], _ = tok.Encode(text, false)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k, text := range corpus {
				ids, err := tok.Encode(text, false)
				if err != nil || !slices.Equal(ids, want[k]) {
					errs <- k
					return
				}
				if _, err := tok.Decode(ids, g%2 == 0); err != nil {
					errs <- k
					return
				}
				d := tok.NewStreamDecoder(nil, []string{"\n"})
				for _, id := range ids {
					d.Add(id)
				}
			}
			if _, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, ChatOptions{AddGenerationPrompt: true}); err != nil {
				errs <- err.Error()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("concurrent use failed: %s", e)
	}
}
