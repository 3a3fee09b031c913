package compat_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/mlxserving/mlxserving/openai"
)

// TestGoSDKAPIKeys: with keys configured, the official client is refused
// without its key (401), a key limited to normal cannot obtain critical
// (403), and each key's request rate holds on its own (429 with
// Retry-After), all as *openai.Error.
func TestGoSDKAPIKeys(t *testing.T) {
	base := startServer(t, openai.WithAPIKeys(
		openai.Key{Name: "app", Secret: "sk-app-0123456789", MaxTier: "normal", RequestsPerMinute: 2},
		openai.Key{Name: "ops", Secret: "sk-ops-0123456789", MaxTier: "critical", Admin: true},
	))
	client := func(key string) oai.Client {
		return oai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	}
	ctx := context.Background()
	status := func(err error) (int, string, http.Header) {
		t.Helper()
		var apiErr *oai.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("error %v is not *openai.Error", err)
		}
		return apiErr.StatusCode, apiErr.Code, apiErr.Response.Header
	}

	wrong := client("sk-wrong-0123456789")
	if _, err := wrong.Chat.Completions.New(ctx, chatParams()); err == nil {
		t.Fatal("wrong key accepted")
	} else if s, code, _ := status(err); s != 401 || code != "invalid_api_key" {
		t.Fatalf("wrong key: %d %s", s, code)
	}
	app, ops := client("sk-app-0123456789"), client("sk-ops-0123456789")
	if _, err := app.Models.List(ctx); err != nil {
		t.Fatalf("models with a key: %v", err)
	}

	// The ops key may ask for critical; the app key may not.
	critical := option.WithHeader("X-Priority", "critical")
	if _, err := ops.Chat.Completions.New(ctx, chatParams(), critical); err != nil {
		t.Fatalf("ops critical: %v", err)
	}
	if _, err := app.Chat.Completions.New(ctx, chatParams(), option.WithJSONSet("priority", "critical")); err == nil {
		t.Fatal("app key obtained critical")
	} else if s, code, _ := status(err); s != 403 || code != "tier_not_allowed" {
		t.Fatalf("app critical: %d %s", s, code)
	}

	// Two requests a minute for app (the refused one above did not count).
	for i := range 2 {
		if _, err := app.Chat.Completions.New(ctx, chatParams()); err != nil {
			t.Fatalf("app request %d: %v", i, err)
		}
	}
	_, err := app.Chat.Completions.New(ctx, chatParams())
	s, code, h := status(err)
	if secs, perr := strconv.Atoi(h.Get("Retry-After")); s != 429 || code != "rate_limit_exceeded" || perr != nil || secs < 1 {
		t.Fatalf("third app request: %d %s Retry-After %q", s, code, h.Get("Retry-After"))
	}
	// ops has its own limits.
	if _, err := ops.Chat.Completions.New(ctx, chatParams()); err != nil {
		t.Fatalf("ops after app's limit: %v", err)
	}
}
