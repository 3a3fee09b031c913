#!/bin/sh
# Several GPUs served as users serve them (2 GPUs): examples/server on the
# 8B-shaped bf16 checkpoint at its full 131,072-token context, driven by
# cmd/loadgen through gpubench's serving mode, in three layouts on the
# same machine — one GPU, tensor parallel 2 (one copy over both), and two
# tensor-parallel-1 replicas (-gpus 0,1, data parallel) — then the greedy
# comparison of tp 2 with tp 1 in float32. Build here, carry bin/:
#
#   for p in gpubench:./cmd/gpubench server:./examples/server loadgen:./cmd/loadgen; do
#     CGO_ENABLED=0 go build -ldflags='-s -w' -o bin/${p%%:*} ${p#*:}; done
#   sh cmd/gpubench/tp_serving.sh OUT [LOADS]     # LOADS: gpubench -loads (default c64:256,c256:1024)
set -u
out=$1
loads=${2:-c64:256,c256:1024}
bin=${BIN:-bin}
py=${PYTHON:-python3}
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$out/env.txt"
serve() { # name, then server flags
	name=$1
	shift
	timeout 200 "$bin/gpubench" -serving -shape llama8b -python "$py" -dir /tmp/llama8b -logs "$out" \
		-server "$bin/server" -loadgen "$bin/loadgen" -loads "$loads" -- "$@" 2>&1 | tee "$out/serving-$name.txt"
	mv "$out/server.log" "$out/server-$name.log" 2>/dev/null
}
part=${PART:-all} # PART=1: one GPU and tp 2; PART=2: two replicas and the float32 check (each under 10 minutes)
if [ "$part" != 2 ]; then
	CUDA_VISIBLE_DEVICES=0 serve one-gpu
	serve tp2 -tp 2
fi
[ "$part" = 1 ] && exit 0
serve two-replicas -gpus 0,1
echo "--- tp 2 against tp 1, float32 greedy"
timeout 150 "$bin/gpubench" -python "$py" -shape llama8b -dir /tmp/llama8b -tp 2 -tp-dtype float32 -batches "" -gen 64 2>&1 | tee "$out/tp-f32.txt"
