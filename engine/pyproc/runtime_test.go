package pyproc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRuntimeInstalledPrivate(t *testing.T) {
	dir, err := installRuntime(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("runtime dir mode %v, %v; want 0700", fi.Mode().Perm(), err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, _ := e.Info()
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", e.Name(), fi.Mode().Perm())
		}
	}
	// A second install reuses and re-verifies the directory.
	if again, err := installRuntime(filepath.Dir(dir)); err != nil || again != dir {
		t.Fatalf("reinstall: %s, %v", again, err)
	}
}

// TestRuntimeTampered: every way another user (or anything else) could
// change what the worker runs makes the start fail with a RuntimeDirError
// naming the path, both at New and at a later worker start.
func TestRuntimeTampered(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(t *testing.T, dir string)
		want   string
	}{
		{"edited file", func(t *testing.T, dir string) {
			appendTo(t, filepath.Join(dir, "worker.py"), "\nimport os; os.system('id')\n")
		}, "differs from this binary's"},
		{"replaced by a link", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "st.py")
			os.Rename(p, p+".orig")
			os.Symlink(p+".orig", p)
		}, "not part of the runtime"},
		{"extra module shadowing torch", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "torch.py"), []byte("raise SystemExit"), 0o600)
		}, "not part of the runtime"},
		{"bytecode cache", func(t *testing.T, dir string) { os.Mkdir(filepath.Join(dir, "__pycache__"), 0o700) }, "not part of the runtime"},
		{"group-writable file", func(t *testing.T, dir string) { os.Chmod(filepath.Join(dir, "decoder.py"), 0o620) }, "writable by other users"},
		{"opened directory", func(t *testing.T, dir string) { os.Chmod(dir, 0o755) }, "want 0700"},
		{"missing file", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "sampling.py")) }, "no such file"},
		{"foreign-owned directory", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("changing a file's owner needs root")
			}
			if err := os.Chown(dir, 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 4242"},
		{"foreign-owned file", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("changing a file's owner needs root")
			}
			if err := os.Chown(filepath.Join(dir, "worker.py"), 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 4242"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cache := t.TempDir()
			dir, err := installRuntime(cache)
			if err != nil {
				t.Fatal(err)
			}
			c.tamper(t, dir)
			var rde *RuntimeDirError
			_, err = New(context.Background(), WithPython("/nonexistent/python3"), WithCacheDir(cache))
			if !errors.As(err, &rde) || !errors.Is(err, ErrUnsafeRuntime) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New over a tampered runtime: %v; want a RuntimeDirError saying %q", err, c.want)
			}
			// A worker (re)start checks again, before running anything.
			cfg := defaults()
			if _, err := startProc(context.Background(), &cfg, dir, 0); !errors.Is(err, ErrUnsafeRuntime) {
				t.Fatalf("startProc over a tampered runtime: %v", err)
			}
		})
	}
}

func TestRuntimeCacheDirChecked(t *testing.T) {
	cache := t.TempDir()
	if err := os.Chmod(cache, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := installRuntime(cache); !errors.Is(err, ErrUnsafeRuntime) || !strings.Contains(err.Error(), "writable by other users") {
		t.Fatalf("world-writable cache dir: %v", err)
	}
	// The sticky bit (as on /tmp) keeps others from renaming our directory.
	if err := os.Chmod(cache, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if _, err := installRuntime(cache); err != nil {
		t.Fatalf("sticky cache dir: %v", err)
	}
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
