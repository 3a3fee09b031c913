// Package compat holds the compatibility tests of mlxserving's OpenAI HTTP
// layer with the official OpenAI clients: github.com/openai/openai-go/v3
// and the npm "openai" package run by Node. It is a module of its own so
// the clients' dependencies stay out of the library's go.mod.
//
// Run it from the repository root:
//
//	source scripts/setup.d/40-compat.sh   # installs the npm client, exports MLXSERVING_NPM_OPENAI
//	(cd compat && go test -race ./...)
package compat
