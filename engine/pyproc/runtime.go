package pyproc

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

//go:embed runtime/*.py
var runtimeFS embed.FS

// installRuntime writes the embedded Python files to cacheDir/pyproc-<hash>
// unless that directory already exists, and returns the directory. The
// files are written to a temporary directory first and renamed into place,
// so concurrent starts never see a half-written runtime.
func installRuntime(cacheDir string) (string, error) {
	if cacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		cacheDir = filepath.Join(base, "mlxserving")
	}
	names, err := fs.Glob(runtimeFS, "runtime/*.py")
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	h := sha256.New()
	files := map[string][]byte{}
	for _, n := range names {
		b, err := runtimeFS.ReadFile(n)
		if err != nil {
			return "", err
		}
		files[filepath.Base(n)] = b
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	dir := filepath.Join(cacheDir, "pyproc-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, "worker.py")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("pyproc: runtime cache: %w", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, "pyproc-tmp-")
	if err != nil {
		return "", fmt.Errorf("pyproc: runtime cache: %w", err)
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(tmp, n), b, 0o644); err != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("pyproc: runtime cache: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(filepath.Join(dir, "worker.py")); serr == nil {
			return dir, nil // another process won the race
		}
		return "", fmt.Errorf("pyproc: runtime cache: %w", err)
	}
	return dir, nil
}
