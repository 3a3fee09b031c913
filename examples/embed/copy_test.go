package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildsOutsideTheModule copies this example into a module of its own,
// as a user starting a program from it would, and builds it there: an
// example that imports this module's internal packages would not build.
func TestBuildsOutsideTheModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	mod := "module example.com/myserver\n\ngo 1.26.0\n\nrequire github.com/mlxserving/mlxserving v0.0.0\n\nreplace github.com/mlxserving/mlxserving => " + root + "\n"
	for name, b := range map[string][]byte{"main.go": src, "go.sum": sum, "go.mod": []byte(mod)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tidy := exec.Command("go", "mod", "tidy")
	tidy.Dir = dir
	if out, err := tidy.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy: %v\n%s", err, out)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "myserver"), ".")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the copied example does not build: %v\n%s", err, out)
	}
	if strings.Contains(string(src), "mlxserving/internal/") {
		t.Error("the example imports an internal package")
	}
}
