package httpbackend

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// maxEmbedBody bounds an embeddings response: 2048 vectors of 8192 values
// in base64 are 89 MiB.
const maxEmbedBody = 128 << 20

// embedBody is the /v1/embeddings request: OpenAI's fields, and
// mlxserving's extensions only when set, so a plain OpenAI-style server
// sees a plain request.
type embedBody struct {
	Model          string `json:"model"`
	Input          any    `json:"input"` // []string or [][]int32
	EncodingFormat string `json:"encoding_format"`
	Dimensions     int    `json:"dimensions,omitempty"`
	User           string `json:"user,omitempty"`
	Truncate       bool   `json:"truncate,omitempty"`
	Cache          bool   `json:"cache,omitempty"`
}

// embedResponse is OpenAI's answer: one item per input, its vector a
// base64 string of little-endian float32 (as asked) or, from an upstream
// that ignores encoding_format, an array of numbers.
type embedResponse struct {
	Data []struct {
		Index     *int            `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Model string `json:"model"`
	Usage *struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
}

// Embed posts the inputs to the upstream's /v1/embeddings and returns its
// vectors. Texts go as an array of strings, token ids as an array of
// arrays; a request that mixes the two (which OpenAI's API cannot carry
// in one body) goes as two requests, concurrently, and their vectors are
// put back in input order. Vectors travel as base64 (encoding_format),
// exact and a third the size of decimals. The priority travels in
// X-Priority; Client as "user"; Truncate and Cache as mlxserving's
// "truncate" and "cache", sent only when set. Deadlines do not cross
// HTTP: ctx bounds the request, and the header timeout bounds the whole
// of it, since the answer comes in one piece once every vector is done.
//
// An upstream's refusal returns an *Error that unwraps to the typed error
// its status and code name, as for completions (an *api.InvalidParamError
// for a 400, an *engine.ContextLengthError, a *scheduler.RateLimitError);
// one that could not be reached or answered 5xx is retryable.
func (b *Backend) Embed(ctx context.Context, req api.EmbedRequest) (*api.Embeddings, error) {
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	var texts, tokens []int // the inputs' indices
	for i, in := range req.Inputs {
		if len(in.Tokens) > 0 {
			tokens = append(tokens, i)
		} else {
			texts = append(texts, i) // an empty one too: the upstream refuses it
		}
	}
	if len(texts) == 0 || len(tokens) == 0 {
		return b.embed(ctx, req, indices(len(req.Inputs)))
	}
	if n := len(req.Inputs); n > api.MaxEmbedInputs {
		// Refused as the upstream would: split, the parts would pass.
		return nil, &api.InvalidParamError{Param: "input", Reason: fmt.Sprintf("%d inputs; at most %d per request", n, api.MaxEmbedInputs)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var res [2]*api.Embeddings
	var errs [2]error
	for i, idx := range [][]int{texts, tokens} {
		wg.Go(func() {
			if res[i], errs[i] = b.embed(ctx, req, idx); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	for _, err := range errs { // the failure, not the cancellation it caused
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	out := &api.Embeddings{Model: res[0].Model, Vectors: make([][]float32, len(req.Inputs)),
		PromptTokens: res[0].PromptTokens + res[1].PromptTokens, Duration: max(res[0].Duration, res[1].Duration)}
	for i, idx := range [][]int{texts, tokens} {
		for j, k := range idx {
			out.Vectors[k] = res[i].Vectors[j]
		}
	}
	return out, nil
}

func indices(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// embed sends the inputs of req at idx, all texts or all token ids, in
// one request.
func (b *Backend) embed(ctx context.Context, req api.EmbedRequest, idx []int) (*api.Embeddings, error) {
	body := embedBody{Model: req.Model, EncodingFormat: "base64", Dimensions: req.Dimensions, User: req.Client,
		Truncate: req.Truncate, Cache: req.Cache}
	if len(idx) > 0 && len(req.Inputs[idx[0]].Tokens) > 0 {
		ids := make([][]int32, len(idx))
		for j, i := range idx {
			ids[j] = req.Inputs[i].Tokens
		}
		body.Input = ids
	} else {
		texts := make([]string, len(idx))
		for j, i := range idx {
			texts[j] = req.Inputs[i].Text
		}
		body.Input = texts
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("httpbackend: encode request: %w", err)
	}
	endpoint := b.base + "/v1/embeddings"
	reqCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	hreq, err := http.NewRequestWithContext(reqCtx, http.MethodPost, endpoint, bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("httpbackend: %w", err)
	}
	setHeaders(hreq.Header, api.Params{Priority: req.Priority}, b.cfg.apiKey)
	hreq.Header.Set("Accept", "application/json")
	begun := time.Now()
	if b.cfg.headerTimeout > 0 {
		timer := time.AfterFunc(b.cfg.headerTimeout, func() { cancel(ErrHeaderTimeout) })
		defer timer.Stop()
	}
	resp, raw, err := b.roundTrip(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(context.Cause(reqCtx), ErrHeaderTimeout) {
			err = ErrHeaderTimeout
		}
		return nil, &Error{URL: endpoint, Err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, inputIndex(statusError(endpoint, resp, raw), idx)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" {
		return nil, &Error{URL: endpoint, Err: protocolError(fmt.Sprintf("content type %q, want application/json", mt), raw)}
	}
	res, err := decodeEmbeddings(raw, len(idx))
	if err != nil {
		return nil, &Error{URL: endpoint, Err: err}
	}
	if res.Model == "" {
		res.Model = req.Model
	}
	res.Duration = time.Since(begun)
	return res, nil
}

// roundTrip sends hreq and reads the whole response: an error status's
// body up to 64 KiB, a 200's up to maxEmbedBody.
func (b *Backend) roundTrip(hreq *http.Request) (*http.Response, []byte, error) {
	resp, err := b.cfg.client.Do(hreq)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	limit := int64(maxEmbedBody)
	if resp.StatusCode != http.StatusOK {
		limit = 64 << 10
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode == http.StatusOK && int64(len(raw)) > limit {
		return nil, nil, protocolError(fmt.Sprintf("embeddings response above %d MiB", maxEmbedBody>>20), nil)
	}
	return resp, raw, nil
}

// decodeEmbeddings reads an embeddings response for n inputs.
func decodeEmbeddings(raw []byte, n int) (*api.Embeddings, error) {
	var r embedResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, protocolError("embeddings response: "+err.Error(), raw)
	}
	if len(r.Data) != n {
		return nil, protocolError(fmt.Sprintf("%d embeddings for %d inputs", len(r.Data), n), raw)
	}
	res := &api.Embeddings{Model: r.Model, Vectors: make([][]float32, n)}
	if r.Usage != nil {
		res.PromptTokens = r.Usage.PromptTokens
	}
	for i, d := range r.Data {
		at := i
		if d.Index != nil {
			at = *d.Index
		}
		if at < 0 || at >= n || res.Vectors[at] != nil {
			return nil, protocolError(fmt.Sprintf("embedding index %d out of range or repeated, for %d inputs", at, n), nil)
		}
		v, err := decodeVector(d.Embedding)
		if err != nil {
			return nil, protocolError(fmt.Sprintf("embedding %d: %v", at, err), nil)
		}
		res.Vectors[at] = v
	}
	return res, nil
}

// decodeVector reads a base64 string of little-endian float32 values, or
// an array of numbers.
func decodeVector(raw json.RawMessage) ([]float32, error) {
	if len(raw) == 0 || raw[0] != '"' {
		var v []float32
		if err := json.Unmarshal(raw, &v); err != nil || len(v) == 0 {
			return nil, errors.New("neither a base64 string nor an array of numbers")
		}
		return v, nil
	}
	// A base64 string holds no escapes but for "\/" from some encoders:
	// it is read in place unless it has any.
	src := raw[1 : len(raw)-1]
	if bytes.IndexByte(src, '\\') >= 0 {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		src = []byte(s)
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(len(src)))
	n, err := base64.StdEncoding.Decode(b, src)
	if err != nil {
		return nil, err
	}
	if n == 0 || n%4 != 0 {
		return nil, fmt.Errorf("%d bytes of base64 floats, want a positive multiple of 4", n)
	}
	v := make([]float32, n/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, nil
}

// inputIndex renames "input[k]" in an upstream's refusal of the inputs at
// idx to the index the caller knows.
func inputIndex(e *Error, idx []int) *Error {
	k, ok := strings.CutPrefix(e.Param, "input[")
	if !ok {
		return e
	}
	k, ok = strings.CutSuffix(k, "]")
	i, err := strconv.Atoi(k)
	if !ok || err != nil || i < 0 || i >= len(idx) || idx[i] == i {
		return e
	}
	e.Param = fmt.Sprintf("input[%d]", idx[i])
	e.Message = strings.Replace(e.Message, "input["+k+"]", e.Param, 1)
	return e
}
