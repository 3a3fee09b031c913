package mlxserving

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// Loads of one checkpoint share a revision (across instances too); a
// changed checkpoint, another engine or a model without files does not.
func TestRevision(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	a, b := revision("pyproc", dir, 1), revision("pyproc", dir, 2)
	if a != b || len(a) != 32 {
		t.Fatalf("two loads of one checkpoint: %q, %q", a, b)
	}
	if revision("mlx", dir, 1) == a {
		t.Error("another engine shares the revision")
	}
	if revision("sim", "", 1) == revision("sim", "", 2) {
		t.Error("models without files share a revision across loads")
	}
	cfg := filepath.Join(dir, "config.json")
	b0, _ := os.ReadFile(cfg)
	if err := os.WriteFile(cfg, append(b0, ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	if revision("pyproc", dir, 3) == a {
		t.Error("a changed config.json keeps the revision")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err := os.WriteFile(cfg, b0, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(files[0], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	if _, err := f.WriteAt([]byte{0x7f}, st.Size()-1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if revision("pyproc", dir, 4) == a {
		t.Error("changed weights keep the revision")
	}
}
