package retry_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoHTTP keeps HTTP out of the classification and of the layers
// below the HTTP API: retry, the batcher, the scheduler, api and the
// engine contract link no net/http (the HTTP layer maps classes to
// statuses: openai.Status).
func TestNoHTTP(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH")
	}
	for _, pkg := range []string{"retry", "batcher", "scheduler", "api", "engine"} {
		out, err := exec.Command(goTool, "list", "-deps", "github.com/mlxserving/mlxserving/"+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == "net/http" {
				t.Errorf("%s links net/http", pkg)
			}
		}
	}
}
