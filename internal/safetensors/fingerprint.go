package safetensors

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// FingerprintBytes is how much of each end of a weights file Fingerprint
// reads: enough to tell checkpoints of one shape apart (the header and the
// first and last tensors' data) without reading gigabytes at every load.
const FingerprintBytes = 1 << 20

// ErrNoWeights is returned by Fingerprint for a directory without
// .safetensors files.
var ErrNoWeights = errors.New("safetensors: no .safetensors files")

// Fingerprint writes to w what tells the checkpoint in dir from another:
// config.json and generation_config.json whole (when present), then, in
// name order, each .safetensors file's name, size (8 bytes little-endian)
// and first and last FingerprintBytes. Hashing it names the checkpoint
// without reading all of its weights. It fails with ErrNoWeights when dir
// has no weights file, or with the error of a file it cannot read.
func Fingerprint(w io.Writer, dir string) error {
	for _, name := range []string{"config.json", "generation_config.json"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			w.Write([]byte(name))
			w.Write(b)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return ErrNoWeights
	}
	slices.Sort(files)
	for _, f := range files {
		if err := fingerprintFile(w, f); err != nil {
			return err
		}
	}
	return nil
}

// fingerprintFile writes file's name, size and both ends to w.
func fingerprintFile(w io.Writer, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var size [8]byte
	binary.LittleEndian.PutUint64(size[:], uint64(st.Size()))
	w.Write([]byte(filepath.Base(file)))
	w.Write(size[:])
	if _, err := io.Copy(w, io.NewSectionReader(f, 0, min(st.Size(), FingerprintBytes))); err != nil {
		return err
	}
	if st.Size() > FingerprintBytes {
		from := max(FingerprintBytes, st.Size()-FingerprintBytes)
		if _, err := io.Copy(w, io.NewSectionReader(f, from, st.Size()-from)); err != nil {
			return err
		}
	}
	return nil
}
