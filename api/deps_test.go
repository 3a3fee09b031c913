package api_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsStandardLibraryOnly keeps api a leaf every caller can import
// cheaply: each import of its non-test files, whatever their build tags,
// is a standard-library package (no dot in the first path element, the
// rule cmd/go uses). A standard-library package imports only others, so
// the direct imports decide the whole dependency set.
func TestImportsStandardLibraryOnly(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if !standard(path) {
				t.Errorf("%s imports %q, outside the standard library", fset.Position(imp.Pos()), path)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source files found")
	}
}

func TestStandard(t *testing.T) {
	for path, want := range map[string]bool{
		"time":          true,
		"encoding/json": true,
		"C":             false,
		"github.com/mlxserving/mlxserving/engine": false,
		"golang.org/x/text/language":              false,
		"example.com/m":                           false,
	} {
		if got := standard(path); got != want {
			t.Errorf("standard(%q) = %v, want %v", path, got, want)
		}
	}
}

// standard reports whether path names a standard-library package. cgo's
// "C" is not one: it needs a C toolchain.
func standard(path string) bool {
	if path == "C" {
		return false
	}
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}
