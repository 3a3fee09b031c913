package mlxserving

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/mlxserving/mlxserving/internal/safetensors"
)

// revision names what a load of a model will answer with, for request
// merging and the response cache: the engine and the checkpoint's
// fingerprint (see safetensors.Fingerprint). Loads of the same checkpoint
// on the same engine — in this process or another instance sharing a
// cache — get the same revision, a changed checkpoint a new one. A model
// without files (or one that cannot be read) gets a revision of its own
// per load, n.
func revision(engineName, dir string, n uint64) string {
	perLoad := engineName + "#" + strconv.FormatUint(n, 10)
	if dir == "" {
		return perLoad
	}
	h := sha256.New()
	h.Write([]byte(engineName))
	if err := safetensors.Fingerprint(h, dir); err != nil {
		return perLoad
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}
