package openai

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/internal/tokenbucket"
)

// access is who may call a route.
type access uint8

const (
	accessKey   access = iota // any valid key (everyone when no keys are set)
	accessOpen                // everyone
	accessAdmin               // keys with Admin
)

// Error types of the key checks, as OpenAI names them.
const typePermission = "permission_error"

type grantCtxKey struct{}

// authenticate finds the key r carries. It returns nil, nil when the
// handler has no keys. Every configured hash is compared, in constant
// time, so the time taken does not say which key came close.
func (h *Handler) authenticate(r *http.Request) (*grant, *apiError) {
	if len(h.cfg.keys) == 0 {
		return nil, nil
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return nil, unauthorized("missing API key: send it as \"Authorization: Bearer <key>\"")
	}
	sum := sha256.Sum256([]byte(token))
	var found *grant
	for _, g := range h.cfg.keys {
		if subtle.ConstantTimeCompare(sum[:], g.hash[:]) == 1 {
			found = g
		}
	}
	if found == nil {
		return nil, unauthorized("incorrect API key provided")
	}
	return found, nil
}

func unauthorized(msg string) *apiError {
	return newAPIError(http.StatusUnauthorized, typeInvalidRequest, "", "invalid_api_key", msg)
}

// checkAccess authenticates r for a route and returns r with the key's
// grant in its context, or the error to answer.
func (h *Handler) checkAccess(w http.ResponseWriter, r *http.Request, a access) (*http.Request, *apiError) {
	if a == accessOpen {
		return r, nil
	}
	g, err := h.authenticate(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="mlxserving"`)
		return r, err
	}
	if g == nil {
		return r, nil
	}
	if a == accessAdmin && !g.admin {
		return r, newAPIError(http.StatusForbidden, typePermission, "", "admin_required",
			fmt.Sprintf("key %q may not use %s: it needs an admin key", g.name, r.URL.Path))
	}
	return r.WithContext(context.WithValue(r.Context(), grantCtxKey{}, g)), nil
}

func grantOf(ctx context.Context) *grant {
	g, _ := ctx.Value(grantCtxKey{}).(*grant)
	return g
}

// mayUseModel reports whether the request's key may use model.
func mayUseModel(ctx context.Context, model string) bool {
	g := grantOf(ctx)
	return g == nil || g.models == nil || g.models[model]
}

// authorize checks a generation request against its key: model, tier and
// limits. A request that names no tier runs at the default (normal) or at
// the key's highest tier if that is lower; one that names a tier above the
// key's is refused. On success it sets the request's client id to the key's name
// and returns the function that charges the finished request's tokens:
// the prompt once and every choice's generated tokens (as usage reports
// them, or as many as arrived before a choice was cut short).
func authorize(ctx context.Context, model string, p *api.Params, namedTier bool) (charge func([]*format), err error) {
	g, err := admit(ctx, model, &p.Priority, p.KeepAlive != nil, namedTier)
	if g == nil || err != nil {
		return func([]*format) {}, err
	}
	p.Client = g.name
	return func(fs []*format) {
		prompt, generated := 0, 0
		for _, f := range fs {
			if f.usage != nil {
				prompt = max(prompt, f.usage.PromptTokens)
				generated += f.usage.CompletionTokens
			} else {
				generated += f.generated
			}
		}
		g.charge(prompt + generated)
	}, nil
}

// admit applies the request's key to a request for model at *tier: the
// models it may use, keep_alive (admin keys only), the highest tier (a
// tier the request did not name is lowered to it) and the per-minute
// limits, taking one request. It returns the key's grant, nil when the
// handler has no keys.
func admit(ctx context.Context, model string, tier *api.Tier, keepAlive, namedTier bool) (*grant, error) {
	g := grantOf(ctx)
	if g == nil {
		return nil, nil
	}
	if g.models != nil && !g.models[model] {
		return nil, newAPIError(http.StatusForbidden, typePermission, "model", "model_not_allowed",
			fmt.Sprintf("key %q may not use model %q", g.name, model))
	}
	if keepAlive && !g.admin {
		// keep_alive decides how long a model holds memory for everyone.
		return nil, newAPIError(http.StatusForbidden, typePermission, "keep_alive", "admin_required",
			fmt.Sprintf("key %q may not set keep_alive: it needs an admin key", g.name))
	}
	if !namedTier && tier.Outranks(g.maxTier) {
		*tier = g.maxTier
	}
	if tier.Outranks(g.maxTier) {
		return nil, newAPIError(http.StatusForbidden, typePermission, "priority", "tier_not_allowed",
			fmt.Sprintf("key %q may use tiers up to %s, not %s", g.name, g.maxTier, *tier))
	}
	if err := g.take(time.Now()); err != nil {
		return nil, err
	}
	return g, nil
}

// take spends one of the key's requests per minute, or refuses a key
// over its requests or in debt on its tokens.
func (g *grant) take(now time.Time) *apiError {
	g.mu.Lock()
	defer g.mu.Unlock()
	if wait := g.tokens.Until(now, 0); wait > 0 { // a key in debt waits it off
		return overLimit(g.name, "tokens", wait)
	}
	if wait := g.requests.Take(now, 1); wait > 0 {
		return overLimit(g.name, "requests", wait)
	}
	return nil
}

// charge spends n of the key's tokens per minute, past empty if need be.
func (g *grant) charge(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tokens.Charge(time.Now(), float64(n))
}

func overLimit(name, what string, wait time.Duration) *apiError {
	wait = max(wait, time.Millisecond) // the message says it to the millisecond
	e := newAPIError(http.StatusTooManyRequests, typeRateLimit, "", "rate_limit_exceeded",
		fmt.Sprintf("key %q is over its %s per minute; retry after %s", name, what, wait.Round(time.Millisecond)))
	e.retryAfter = wait
	return e
}

// newBucket returns a bucket holding up to one minute's allowance and
// refilling continuously.
func newBucket(perMinute int) *tokenbucket.Bucket {
	return tokenbucket.New(float64(perMinute)/60, float64(perMinute))
}
