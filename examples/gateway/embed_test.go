package main

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/internal/natstest"
	"github.com/mlxserving/mlxserving/openai"
)

// TestGatewayEmbeddings: POST /v1/embeddings through the gateway reaches
// an instance over NATS, and an -upstream server over HTTP, and answers
// the instance's vectors bit for bit.
func TestGatewayEmbeddings(t *testing.T) {
	url := natstest.Start(t, "../../balancer/natsbackend/testdata/nats-server.conf")
	inc, err := nats.Connect(url, nats.UserInfo("instance", "instance-secret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inc.Close)
	srv := serveInstance(t, inc, "node-1")
	t.Setenv(natsPasswordEnv, "gateway-secret")
	h, err := openai.New(srv)
	if err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(h)
	defer upstream.Close()

	inputs := []api.EmbedInput{{Text: "the first document"}, {Text: "a second one"}, {Text: "and a third"}}
	want, err := srv.Embed(context.Background(), api.EmbedRequest{Model: "tiny", Inputs: inputs})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	body := `{"model":"tiny","input":["the first document","a second one","and a third"],"encoding_format":"base64"}`
	for _, args := range [][]string{{"-nats", url, "-nats-user", "gateway"}, {"-upstream", upstream.URL}} {
		addr, stop := startGateway(t, args...)
		var code int
		var got string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if code, got = call(t, client, http.MethodPost, "http://"+addr+"/v1/embeddings", "", body); code == http.StatusOK {
				break // once the instance is found
			}
		}
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", args[0], code, got)
		}
		var res struct {
			Data []struct {
				Index     int    `json:"index"`
				Embedding string `json:"embedding"`
			} `json:"data"`
			Model string `json:"model"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(got), &res); err != nil {
			t.Fatal(err)
		}
		if res.Model != want.Model || res.Usage.PromptTokens != want.PromptTokens || len(res.Data) != len(want.Vectors) {
			t.Fatalf("%s: %s; want %d vectors, %d tokens", args[0], got, len(want.Vectors), want.PromptTokens)
		}
		for _, d := range res.Data {
			b, err := base64.StdEncoding.DecodeString(d.Embedding)
			w := want.Vectors[d.Index]
			if err != nil || len(b) != 4*len(w) {
				t.Fatalf("%s: vector %d: %d bytes, %v", args[0], d.Index, len(b), err)
			}
			for j, x := range w {
				if math.Float32bits(x) != binary.LittleEndian.Uint32(b[4*j:]) {
					t.Fatalf("%s: vector %d differs at %d", args[0], d.Index, j)
				}
			}
		}
		stop()
	}
}
