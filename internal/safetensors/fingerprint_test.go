package safetensors_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/internal/safetensors"
)

func fingerprint(t *testing.T, dir string) [32]byte {
	t.Helper()
	var b bytes.Buffer
	if err := safetensors.Fingerprint(&b, dir); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b.Bytes())
}

// The fingerprint follows the configs, the files' names and sizes and both
// ends of each file, and nothing else.
func TestFingerprint(t *testing.T) {
	dir := t.TempDir()
	if err := safetensors.Fingerprint(&bytes.Buffer{}, dir); !errors.Is(err, safetensors.ErrNoWeights) {
		t.Fatalf("empty dir: %v, want ErrNoWeights", err)
	}
	weights := filepath.Join(dir, "model.safetensors")
	data := make([]byte, 3*safetensors.FingerprintBytes)
	write := func(name string, b []byte) {
		t.Helper()
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(weights, data)
	write(filepath.Join(dir, "config.json"), []byte(`{"a":1}`))
	base := fingerprint(t, dir)
	if fingerprint(t, dir) != base {
		t.Fatal("two fingerprints of one checkpoint differ")
	}
	for _, c := range []struct {
		name    string
		change  func()
		changes bool
	}{
		{"the middle of the weights", func() { data[len(data)/2] = 1; write(weights, data) }, false},
		{"the first MiB", func() { data[0] = 1; write(weights, data) }, true},
		{"the last MiB", func() { data[len(data)-1] = 1; write(weights, data) }, true},
		{"the size", func() { data = append(data, 0); write(weights, data) }, true},
		{"config.json", func() { write(filepath.Join(dir, "config.json"), []byte(`{"a":2}`)) }, true},
		{"generation_config.json", func() { write(filepath.Join(dir, "generation_config.json"), []byte(`{}`)) }, true},
		{"another weights file", func() { write(filepath.Join(dir, "extra.safetensors"), nil) }, true},
		{"an unrelated file", func() { write(filepath.Join(dir, "README.md"), []byte("x")) }, false},
	} {
		c.change()
		got := fingerprint(t, dir)
		if (got != base) != c.changes {
			t.Errorf("changing %s: fingerprint changed %v, want %v", c.name, got != base, c.changes)
		}
		base = got
	}
}
