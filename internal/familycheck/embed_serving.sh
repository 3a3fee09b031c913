#!/bin/sh
# Embeddings served as users serve them, on the GPU machine (Go is not
# needed there). Build here, then carry bin/:
#
#   CGO_ENABLED=0 go build -o bin/familycheck ./internal/familycheck
#   CGO_ENABLED=0 go build -o bin/server ./examples/server
#   CGO_ENABLED=0 go build -o bin/loadgen ./cmd/loadgen
#
#   sh internal/familycheck/embed_serving.sh OUT
#
# Random-weight checkpoints of the bge-base and Qwen3-Embedding-0.6B
# shapes (testmodel, bfloat16, their tokenizers and sentence-transformers
# files) served by examples/server on the torch engine at their full
# context: /v1/embeddings at 64 concurrent clients (one 96-word input a
# request, each request its own text), then on the Qwen3 shape chat alone
# (16 clients, 64 tokens) and chat beside the 64 embedding clients: the
# chat TTFT p99 the embeddings cost.
set -u
out=$1
py=${PYTHON:-python3}
d=/tmp/embedserve
mkdir -p "$out" $d
serve() { # dir id port
	bin/server -engine pyproc -python "$py" -model "$1" -model-id "$2" -addr 127.0.0.1:$3 > "$out/server-$2.log" 2>&1 &
	pid=$!
	for _ in $(seq 240); do
		curl -sf 127.0.0.1:$3/ready > /dev/null && return 0
		sleep 0.5
	done
	echo "server $2 not ready"; tail -20 "$out/server-$2.log"; return 1
}
bin/familycheck -write float -shape bge-base -dir $d/bge || exit 1
bin/familycheck -write float -shape qwen3-embedding-0.6b -dir $d/qe || exit 1
serve $d/bge bge 8081 && {
	bin/loadgen -url http://127.0.0.1:8081 -endpoint embeddings -inputs 1 -input-words 96 -concurrency 64 \
		-requests 1000000 -duration 30s -seed 11 | tee "$out/bge-embed-64.txt"
	kill $pid; wait $pid
}
serve $d/qe qe 8082 && {
	bin/loadgen -url http://127.0.0.1:8082 -endpoint embeddings -inputs 1 -input-words 96 -concurrency 64 \
		-requests 1000000 -duration 30s -seed 12 | tee "$out/qe-embed-64.txt"
	bin/loadgen -url http://127.0.0.1:8082 -endpoint chat -concurrency 16 -max-tokens 64 -input-words 96 \
		-requests 1000000 -duration 30s -seed 13 | tee "$out/qe-chat-alone.txt"
	bin/loadgen -url http://127.0.0.1:8082 -endpoint embeddings -inputs 1 -input-words 96 -concurrency 64 \
		-requests 1000000 -duration 36s -seed 14 > "$out/qe-embed-beside.txt" &
	lg=$!
	sleep 3
	bin/loadgen -url http://127.0.0.1:8082 -endpoint chat -concurrency 16 -max-tokens 64 -input-words 96 \
		-requests 1000000 -duration 30s -seed 15 | tee "$out/qe-chat-beside.txt"
	wait $lg
	cat "$out/qe-embed-beside.txt"
	kill $pid; wait $pid
}
