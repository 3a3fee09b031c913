package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEmbed runs the example on the real Python engine with the generated
// model and checks that a reply streamed and ended with its usage.
func TestEmbed(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-python", py, "-max-tokens", "8", "-prompt", "Hello"}, &out); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`\[finish: (stop|length), (\d+) prompt \+ (\d+) generated tokens\]\n$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("output %q lacks the finish line", out.String())
	}
	if gen, _ := strconv.Atoi(m[3]); gen < 1 || gen > 8 || (m[1] == "length" && gen != 8) {
		t.Fatalf("output %q: %s generated tokens", out.String(), m[3])
	}
	if err := run(context.Background(), []string{"-python", "/nonexistent/python3"}, &out); err == nil {
		t.Fatal("a missing interpreter was not reported")
	}
}
