package main

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/mlxserving/mlxserving/openai"
)

// keysEnv holds a comma-separated name:key list, for deployments that pass
// secrets through the environment. Such keys have full rights.
const keysEnv = "MLXSERVING_API_KEYS"

// apiKeys returns the handler option for -api-keys FILE and $MLXSERVING_API_KEYS
// (both may be given), or nil when neither is: then the server takes
// requests from anyone who can reach it.
func apiKeys(file string, getenv func(string) string) ([]openai.Option, int, error) {
	var keys []openai.Key
	if file != "" {
		k, err := openai.LoadKeyFile(file)
		if err != nil {
			return nil, 0, fmt.Errorf("-api-keys: %w", err)
		}
		keys = append(keys, k...)
	}
	if list := getenv(keysEnv); list != "" {
		k, err := openai.ParseKeyList(list)
		if err != nil {
			return nil, 0, fmt.Errorf("$%s: %w", keysEnv, err)
		}
		keys = append(keys, k...)
	}
	if len(keys) == 0 {
		return nil, 0, nil
	}
	return []openai.Option{openai.WithAPIKeys(keys...)}, len(keys), nil
}

// warnIfExposed warns when the server listens beyond loopback without keys.
func warnIfExposed(addr net.Addr, keys int, log *slog.Logger) {
	if keys > 0 {
		log.Info("API keys required", "keys", keys)
		return
	}
	tcp, ok := addr.(*net.TCPAddr)
	if ok && tcp.IP.IsLoopback() {
		return
	}
	log.Warn("serving a non-loopback address WITHOUT API keys: anyone who can reach it may use every model and tier; pass -api-keys FILE or set $"+keysEnv,
		"addr", addr.String())
}
