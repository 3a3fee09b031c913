package openai

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkAuthenticate measures a request's key check: one SHA-256 and a
// constant-time compare against every configured key.
func BenchmarkAuthenticate(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			var cfg config
			keys := make([]Key, n)
			for i := range keys {
				keys[i] = Key{Name: fmt.Sprintf("k%d", i), Secret: fmt.Sprintf("sk-bench-%08d", i)}
			}
			if err := WithAPIKeys(keys...)(&cfg); err != nil {
				b.Fatal(err)
			}
			h := &Handler{cfg: cfg}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			r.Header.Set("Authorization", fmt.Sprintf("Bearer sk-bench-%08d", n-1))
			b.ReportAllocs()
			for b.Loop() {
				if g, err := h.authenticate(r); err != nil || g == nil {
					b.Fatal(err)
				}
			}
		})
	}
}
