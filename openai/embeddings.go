package openai

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"

	"github.com/mlxserving/mlxserving/api"
)

// embeddingRequest is POST /v1/embeddings' body: OpenAI's fields and the
// server's extensions.
type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	User           string          `json:"user"`

	// Extensions.
	Priority string `json:"priority"`
	// Truncate cuts inputs over the model's limit instead of refusing
	// them (TEI's truncate).
	Truncate bool `json:"truncate"`
	Cache    bool `json:"cache"`
}

type embeddingResponse struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingUsage  `json:"usage"`
}

type embeddingData struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type embeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

func (h *Handler) embeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingRequest
	if err := h.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	er, err := req.embed(r)
	if err != nil {
		writeError(w, err)
		return
	}
	g, err := admit(r.Context(), er.Model, &er.Priority, false, req.tierFields().namesTier(r))
	if err != nil {
		writeError(w, err)
		return
	}
	if g != nil {
		er.Client = g.name
	}
	res, err := h.srv.Embed(r.Context(), er)
	if err != nil {
		writeError(w, err)
		return
	}
	if g != nil {
		g.charge(res.PromptTokens)
	}
	out := embeddingResponse{Object: "list", Model: res.Model, Data: make([]embeddingData, len(res.Vectors)),
		Usage: embeddingUsage{PromptTokens: res.PromptTokens, TotalTokens: res.PromptTokens}}
	for i, v := range res.Vectors {
		d := embeddingData{Object: "embedding", Index: i, Embedding: v}
		if req.EncodingFormat == "base64" {
			d.Embedding = base64Floats(v)
		}
		out.Data[i] = d
	}
	writeJSON(w, http.StatusOK, out)
}

// embed checks the body and converts it into the library's request.
func (e *embeddingRequest) embed(r *http.Request) (api.EmbedRequest, error) {
	req := api.EmbedRequest{Model: e.Model, Truncate: e.Truncate, Cache: e.Cache}
	if e.Model == "" {
		return req, badRequest("model", "missing_field", "field \"model\" is required")
	}
	switch e.EncodingFormat {
	case "", "float", "base64":
	default:
		return req, badRequest("encoding_format", "invalid_value", "encoding_format %q: want float or base64", e.EncodingFormat)
	}
	if e.Dimensions != nil {
		if *e.Dimensions < 1 {
			return req, badRequest("dimensions", "invalid_value", "dimensions is %d: it must be at least 1", *e.Dimensions)
		}
		req.Dimensions = *e.Dimensions
	}
	var err error
	if req.Priority, err = e.tierFields().tier(r); err != nil {
		return req, err
	}
	req.Inputs, err = parseEmbedInput(e.Input)
	return req, err
}

// tierFields are the body's fields that name a tier, as completions
// read them (the priority field, else the X-Priority header).
func (e *embeddingRequest) tierFields() *commonFields { return &commonFields{Priority: e.Priority} }

// parseEmbedInput reads "input": a string, an array of strings, an array
// of token ids, or an array of arrays of token ids.
func parseEmbedInput(raw json.RawMessage) ([]api.EmbedInput, error) {
	if isNull(raw) {
		return nil, badRequest("input", "missing_field", "field \"input\" is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return oneEach([]string{s}, nil)
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		return oneEach(texts, nil)
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		return oneEach(nil, [][]int32{ids})
	}
	var lists [][]int32
	if json.Unmarshal(raw, &lists) == nil {
		return oneEach(nil, lists)
	}
	return nil, badRequest("input", "invalid_type",
		"field \"input\" must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
}

// oneEach makes one input of each text or token list, refusing empty ones
// and more than the server takes.
func oneEach(texts []string, lists [][]int32) ([]api.EmbedInput, error) {
	n := len(texts) + len(lists)
	switch {
	case n == 0:
		return nil, badRequest("input", "invalid_value", "input holds no inputs")
	case n > api.MaxEmbedInputs:
		return nil, badRequest("input", "invalid_value", "input holds %d inputs: at most %d per request", n, api.MaxEmbedInputs)
	}
	out := make([]api.EmbedInput, 0, n)
	for i, t := range texts {
		if t == "" {
			return nil, badRequest("input", "invalid_value", "input %d is an empty string", i)
		}
		out = append(out, api.EmbedInput{Text: t})
	}
	for i, l := range lists {
		if len(l) == 0 {
			return nil, badRequest("input", "invalid_value", "input %d holds no token ids", i)
		}
		out = append(out, api.EmbedInput{Tokens: l})
	}
	return out, nil
}

// base64Floats is v as OpenAI's base64 encoding_format sends it: the
// little-endian bytes of each float32.
func base64Floats(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}
