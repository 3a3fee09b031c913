package mlxserving

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// fingerprintBytes is how much of each end of a weights file the
// revision reads: enough to tell checkpoints of one shape apart without
// reading gigabytes at every load.
const fingerprintBytes = 1 << 20

// revision names what a load of a model will answer with, for request
// merging and the response cache: the engine and a fingerprint of the
// checkpoint (config.json and generation_config.json whole, each
// safetensors file's name, size, and first and last MiB). Loads of the same
// checkpoint on the same engine — in this process or another instance
// sharing a cache — get the same revision, a changed checkpoint a new one.
// A model without files (or one that cannot be read) gets a revision of
// its own per load, n.
func revision(engineName, dir string, n uint64) string {
	perLoad := engineName + "#" + strconv.FormatUint(n, 10)
	if dir == "" {
		return perLoad
	}
	h := sha256.New()
	h.Write([]byte(engineName))
	for _, name := range []string{"config.json", "generation_config.json"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			h.Write([]byte(name))
			h.Write(b)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil || len(files) == 0 {
		return perLoad
	}
	slices.Sort(files)
	for _, f := range files {
		if !fingerprint(h, f) {
			return perLoad
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// fingerprint writes file's name, size and both ends to h.
func fingerprint(h io.Writer, file string) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false
	}
	var size [8]byte
	binary.LittleEndian.PutUint64(size[:], uint64(st.Size()))
	h.Write([]byte(filepath.Base(file)))
	h.Write(size[:])
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, min(st.Size(), fingerprintBytes))); err != nil {
		return false
	}
	if st.Size() > fingerprintBytes {
		from := max(fingerprintBytes, st.Size()-fingerprintBytes)
		if _, err := io.Copy(h, io.NewSectionReader(f, from, st.Size()-from)); err != nil {
			return false
		}
	}
	return true
}
