package pyproc

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// The runtime: worker.py and the Python package beside it, every *.py of
// every directory (a pattern per level: a directory pattern would leave
// out __init__.py, and none takes the __pycache__ a local run writes).
//
//go:embed runtime/*.py runtime/*/*.py runtime/*/*/*.py
var runtimeFS embed.FS

// ErrUnsafeRuntime means the directory the runtime is run from could be, or
// was, changed by someone else: another owner, write access for others, a
// file that differs from the one embedded in this binary, or an extra file.
// The engine refuses to start a worker from it.
var ErrUnsafeRuntime = errors.New("pyproc: unsafe runtime directory")

// RuntimeDirError names the path and what is wrong with it. Unwrap yields
// ErrUnsafeRuntime.
type RuntimeDirError struct {
	Path   string
	Reason string
}

func (e *RuntimeDirError) Error() string {
	return fmt.Sprintf("pyproc: refusing runtime directory: %s: %s (remove it to have it rewritten)", e.Path, e.Reason)
}

// Unwrap returns ErrUnsafeRuntime.
func (e *RuntimeDirError) Unwrap() error { return ErrUnsafeRuntime }

// runtimeFiles returns the embedded Python files by their path in the
// runtime directory (slash-separated), the directories below it that hold
// them, and the content hash naming the runtime directory.
func runtimeFiles() (files map[string][]byte, dirs map[string]bool, sum string, err error) {
	sub, err := fs.Sub(runtimeFS, "runtime")
	if err != nil {
		return nil, nil, "", err
	}
	files, dirs = map[string][]byte{}, map[string]bool{}
	var names []string
	err = fs.WalkDir(sub, ".", func(n string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && n != ".":
			dirs[n] = true
		case !d.IsDir():
			names = append(names, n)
		}
		return nil
	})
	if err != nil {
		return nil, nil, "", err
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := fs.ReadFile(sub, n)
		if err != nil {
			return nil, nil, "", err
		}
		files[n] = b
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return files, dirs, hex.EncodeToString(h.Sum(nil))[:16], nil
}

// installRuntime writes the embedded Python files to cacheDir/pyproc-<hash>
// unless that directory already exists, and returns the directory, after
// verifying it (see verifyRuntime). The directory and those below it are
// created 0700 and the files 0600, in a temporary directory first that is
// renamed into place, so concurrent starts never see a half-written
// runtime.
func installRuntime(cacheDir string) (string, error) {
	if cacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		cacheDir = filepath.Join(base, "mlxserving")
	}
	files, dirs, sum, err := runtimeFiles()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return "", fmt.Errorf("pyproc: runtime cache: %w", err)
	}
	if err := checkCacheDir(cacheDir); err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, "pyproc-"+sum)
	if _, err := os.Lstat(dir); err == nil {
		return dir, verifyRuntime(dir)
	}
	tmp, err := os.MkdirTemp(cacheDir, "pyproc-tmp-")
	if err != nil {
		return "", fmt.Errorf("pyproc: runtime cache: %w", err)
	}
	if err := writeRuntime(tmp, files, dirs); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("pyproc: runtime cache: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Lstat(dir); serr != nil {
			return "", fmt.Errorf("pyproc: runtime cache: %w", err)
		}
		// Another process won the race; its directory is verified below.
	}
	return dir, verifyRuntime(dir)
}

// writeRuntime writes files (and the directories dirs that hold them) into
// the new directory dir.
func writeRuntime(dir string, files map[string][]byte, dirs map[string]bool) error {
	for d := range dirs {
		if err := os.MkdirAll(filepath.Join(dir, filepath.FromSlash(d)), 0o700); err != nil {
			return err
		}
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(n)), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// checkCacheDir refuses a cache directory another user could rename our
// runtime out of: it must belong to us (or root) and not be writable by
// others, unless it has the sticky bit (like /tmp).
func checkCacheDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("pyproc: runtime cache: %w", err)
	}
	if uid, ok := owner(fi); ok && uid != os.Geteuid() && uid != 0 {
		return &RuntimeDirError{Path: dir, Reason: fmt.Sprintf("owned by uid %d, not by this process's uid %d", uid, os.Geteuid())}
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return &RuntimeDirError{Path: dir, Reason: fmt.Sprintf("writable by other users (mode %v)", fi.Mode().Perm())}
	}
	return nil
}

// verifyRuntime checks the runtime directory before a worker starts from
// it: a real directory (not a link) of ours with mode 0700, holding exactly
// the embedded files and the directories that hold them, each directory a
// real one of ours with mode 0700 and each file a regular file of ours that
// nobody else can write and whose SHA-256 matches the embedded one. Python
// caches (__pycache__, at any level) are refused too: workers run with -B
// and never write one, so one there was put there by someone else.
func verifyRuntime(dir string) error {
	files, dirs, _, err := runtimeFiles()
	if err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return &RuntimeDirError{Path: dir, Reason: err.Error()}
	}
	if err := checkMine(dir, fi, true); err != nil {
		return err
	}
	// Everything there: the runtime's directories and files only. WalkDir
	// does not follow links; a link is not a directory, so it is not
	// entered and fails as an extra entry or in checkMine below.
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return &RuntimeDirError{Path: path, Reason: err.Error()}
		}
		if path == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return &RuntimeDirError{Path: path, Reason: err.Error()}
		}
		rel = filepath.ToSlash(rel)
		if _, ok := files[rel]; ok {
			return nil
		}
		if !dirs[rel] {
			return &RuntimeDirError{Path: path, Reason: "not part of the runtime"}
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return &RuntimeDirError{Path: path, Reason: err.Error()}
		}
		return checkMine(path, fi, true)
	})
	if err != nil {
		return err
	}
	for name, want := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		fi, err := os.Lstat(path)
		if err != nil {
			return &RuntimeDirError{Path: path, Reason: err.Error()}
		}
		if err := checkMine(path, fi, false); err != nil {
			return err
		}
		got, err := os.ReadFile(path)
		if err != nil {
			return &RuntimeDirError{Path: path, Reason: err.Error()}
		}
		if gs, ws := sha256.Sum256(got), sha256.Sum256(want); !bytes.Equal(gs[:], ws[:]) {
			return &RuntimeDirError{Path: path, Reason: fmt.Sprintf("content (sha256 %x) differs from this binary's (sha256 %x)", gs[:8], ws[:8])}
		}
	}
	return nil
}

// checkMine checks type, owner and mode of a runtime path.
func checkMine(path string, fi os.FileInfo, dir bool) error {
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return &RuntimeDirError{Path: path, Reason: "is a symbolic link"}
	case dir && !fi.IsDir():
		return &RuntimeDirError{Path: path, Reason: "not a directory"}
	case !dir && !fi.Mode().IsRegular():
		return &RuntimeDirError{Path: path, Reason: "not a regular file"}
	}
	if uid, ok := owner(fi); ok && uid != os.Geteuid() {
		return &RuntimeDirError{Path: path, Reason: fmt.Sprintf("owned by uid %d, not by this process's uid %d", uid, os.Geteuid())}
	}
	if dir && fi.Mode().Perm() != 0o700 {
		return &RuntimeDirError{Path: path, Reason: fmt.Sprintf("mode %v, want 0700", fi.Mode().Perm())}
	}
	if !dir && fi.Mode().Perm()&0o022 != 0 {
		return &RuntimeDirError{Path: path, Reason: fmt.Sprintf("writable by other users (mode %v)", fi.Mode().Perm())}
	}
	return nil
}
