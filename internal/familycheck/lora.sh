#!/bin/sh
# LoRA adapters served as users serve them, on the GPU machine (Go is not
# needed there). Build here, then carry bin/:
#
#   CGO_ENABLED=0 go build -o bin/familycheck ./internal/familycheck
#   CGO_ENABLED=0 go build -o bin/server ./examples/server
#   CGO_ENABLED=0 go build -o bin/loadgen ./cmd/loadgen
#
#   sh internal/familycheck/lora.sh OUT [SHAPE]
#
# A random-weight checkpoint of SHAPE (default llama8b, bfloat16) and 32
# rank-16 PEFT adapters of it (every projection of every layer), served by
# examples/server on the torch engine at the checkpoint's full context
# with every adapter registered (-lora-slots 32). Loads, one after
# another on the same server, each its own prompt seed: 64 clients on the
# base alone, then spread over the base and 1, 8 and 32 adapters (requests
# take the models in turn), then the base alone again. Then adapter load
# times: POST /v1/load_lora_adapter (read and checked in Go), the first
# request's TTFT (the engine loads it into a slot) and the second's.
# PORT, LORADATA and BIN (the server's directory) let two builds run at
# once on two GPUs of one machine over the same checkpoint and adapters;
# DURATION sets each load's length (default 20s); LORA_FLAGS adds server
# flags (-lora-dense: the dense delta over every slot, not the segmented
# kernels).
set -u
out=$1
shape=${2:-llama8b}
py=${PYTHON:-python3}
d=${LORADATA:-/tmp/lorabench}
port=${PORT:-8090}
bin=${BIN:-bin} # the server's directory (a build to compare beside this one)
duration=${DURATION:-20s}
flags=${LORA_FLAGS:-}
mkdir -p "$out" $d
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/env.txt"
t0=$(date +%s)
[ -f $d/base/config.json ] || bin/familycheck -write float -shape "$shape" -dir $d/base || exit 1
echo "checkpoint: $(($(date +%s) - t0)) s" | tee -a "$out/env.txt"
lora=""
for i in $(seq 1 33); do
	[ -f $d/a$i/adapter_config.json ] || bin/familycheck -write adapter -shape "$shape" -adapter-rank 16 -adapter-seed $i -dir $d/a$i || exit 1
	[ $i -le 32 ] && lora="$lora -lora a$i=$d/a$i"
done
echo "adapters written: $(($(date +%s) - t0)) s" | tee -a "$out/env.txt"
# shellcheck disable=SC2086
$bin/server -engine pyproc -python "$py" -model $d/base -model-id base -addr 127.0.0.1:$port -lora-slots 32 -max-lora-rank 16 $flags $lora > "$out/server.log" 2>&1 &
pid=$!
ready=0
for _ in $(seq 480); do
	curl -sf 127.0.0.1:$port/ready > /dev/null && grep -q 'serving adapter.*adapter=a32' "$out/server.log" && { ready=1; break; }
	sleep 0.5
done
[ $ready = 1 ] || { echo "server not ready"; tail -30 "$out/server.log"; kill $pid; exit 1; }
models() { # the base and adapters a1..aN
	m=base
	for i in $(seq 1 "$1"); do m="$m,a$i"; done
	echo $m
}
seed=100
for n in 0 1 8 32 0; do
	seed=$((seed + 1))
	bin/loadgen -url http://127.0.0.1:$port -model "$(models $n)" -concurrency 64 -input-words 400 -max-tokens 128 \
		-requests 1000000 -duration "$duration" -seed $seed | tee "$out/c64-adapters$n-seed$seed.txt"
done
{
	t=$(curl -s -o /dev/null -w '%{time_total} s, HTTP %{http_code}' 127.0.0.1:$port/v1/load_lora_adapter -d "{\"lora_name\":\"a33\",\"lora_path\":\"$d/a33\"}")
	echo "load_lora_adapter (read and checked, rank 16): $t"
	for turn in first second third; do
		t=$(curl -s -o /dev/null -w '%{time_total} s, HTTP %{http_code}' 127.0.0.1:$port/v1/completions -d '{"model":"a33","prompt":"hello there","max_tokens":1}')
		echo "$turn request of a33, max_tokens 1: $t"
	done
	t=$(curl -s -o /dev/null -w '%{time_total} s, HTTP %{http_code}' 127.0.0.1:$port/v1/completions -d '{"model":"base","prompt":"hello there","max_tokens":1}')
	echo "base request, max_tokens 1: $t"
} 2>&1 | tee "$out/adapter-load.txt"
kill $pid
wait $pid
grep -i 'error\|warn\|restart\|lost' "$out/server.log" | tail -20
