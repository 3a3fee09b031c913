package pyproc

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

func TestTuningRefusesOutOfRange(t *testing.T) {
	for _, tu := range []Tuning{
		{BlockSize: -1}, {BlockSize: 1025}, {WindowStep: -8},
		{KVFraction: -0.1}, {KVFraction: 1.5}, {KVFraction: math.NaN()},
		{TPTimeout: -time.Second}, {StepTokens: -1}, {TraceSkip: -1}, {TraceSteps: -5}, {TraceSteps: MaxTraceSteps + 1},
	} {
		var c config
		err := WithTuning(tu)(&c)
		if err == nil || !strings.Contains(err.Error(), "pyproc: Tuning.") {
			t.Errorf("WithTuning(%+v) = %v, want an error naming the field", tu, err)
		}
	}
}

// TestTuningSettings checks what the worker is told: every key, the zero
// Tuning as the documented defaults, each field on its key.
func TestTuningSettings(t *testing.T) {
	decode := func(tu Tuning) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(tu.settingsArg()), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	want := map[string]any{"block_size": 16.0, "window_step": 0.0, "kv_fraction": 0.8, "prefix_cache": true,
		"split_steps": true, "overlap": true, "prefill_graphs": true, "prompt_attention": true, "kernels": true, "varlen": true, "attn_prefetch": true, "lora_plan": "auto",
		"lora_side_stream": true, "fp8_scaled_mm": true, "tp_timeout": 300.0, "tp_graphs": true, "tp_oneshot": true, "profile": false,
		"trace_dir": "", "trace_skip": 0.0, "trace_steps": 200.0, "max_lookahead": float64(maxLookahead), "step_tokens": 0.0}
	got := decode(Tuning{})
	if len(got) != len(want) {
		t.Errorf("defaults: %d keys %v, want %d", len(got), got, len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("defaults: %s = %v, want %v", k, got[k], v)
		}
	}
	got = decode(Tuning{BlockSize: 4, WindowStep: 8, KVFraction: 0.5, NoPrefixCache: true, NoSplitSteps: true, NoOverlap: true, NoPrefillGraphs: true, NoPromptAttention: true,
		NoKernels: true, NoVarlen: true, NoAttnPrefetch: true, DenseLoRA: true, NoLoRASideStream: true, NoFP8ScaledMM: true,
		TPTimeout: 3 * time.Second, NoTPGraphs: true, NoOneShotAllReduce: true, Profile: true, StepTokens: 8192,
		TraceDir: "/tmp/traces", TraceSkip: 100, TraceSteps: 50})
	set := map[string]any{"block_size": 4.0, "window_step": 8.0, "kv_fraction": 0.5, "prefix_cache": false,
		"split_steps": false, "overlap": false, "prefill_graphs": false, "prompt_attention": false, "kernels": false, "varlen": false, "attn_prefetch": false, "lora_plan": "dense",
		"lora_side_stream": false, "fp8_scaled_mm": false, "tp_timeout": 3.0, "tp_graphs": false, "tp_oneshot": false, "profile": true, "step_tokens": 8192.0,
		"trace_dir": "/tmp/traces", "trace_skip": 100.0, "trace_steps": 50.0}
	for k, v := range set {
		if got[k] != v {
			t.Errorf("set: %s = %v, want %v", k, got[k], v)
		}
	}
}

// TestTuningReachesWorker loads the tiny model with blocks of 8 tokens:
// the worker pages with what the engine was told, not its default.
func TestTuningReachesWorker(t *testing.T) {
	e := newEngine(t, WithTuning(Tuning{BlockSize: 8}))
	m := load(t, e, tiny(t))
	if bs := m.Info().BlockSize; bs != 8 {
		t.Fatalf("Info().BlockSize = %d, want 8 (Tuning.BlockSize)", bs)
	}
}

// TestParamKeysAreWhatIsWritten: paramKeys, which the handshake checks
// against the keys the worker reads, are exactly the keys a params object
// with every field set, a mask and a loop carries.
func TestParamKeysAreWhatIsWritten(t *testing.T) {
	p := &engine.SamplingParams{Temperature: 0.5, TopP: 0.9, TopK: 5, MinP: 0.1, RepetitionPenalty: 1.1,
		HasSeed: true, Seed: 7, Logprobs: true, TopLogprobs: 2, PresencePenalty: 0.2, FrequencyPenalty: 0.3,
		Generated: 4, LogitBias: map[int32]float32{3: 1}}
	mask := []uint64{0b1011}
	b := appendParams(nil, p, true, mask, 64)
	b = appendLoop(b[:len(b)-1], mask, 2, 64)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	var written []string
	for k := range m {
		written = append(written, k)
	}
	slices.Sort(written)
	want := slices.Sorted(slices.Values(paramKeys))
	if !slices.Equal(written, want) {
		t.Errorf("written keys %v, paramKeys %v", written, want)
	}
	caps := map[string]any{"params": []any{"t", "p", "k"}}
	if missing := unreadParams(caps); len(missing) != len(paramKeys)-3 || slices.Contains(missing, "t") {
		t.Errorf("unreadParams = %v", missing)
	}
}
