#!/bin/sh
# A model bigger than one GPU, served as users serve it: a random-weight
# bf16 checkpoint of SHAPE (llama70b: Llama-3.1-70B, about 141 GB, on
# 4 GPUs; qwen3-32b: Qwen3-32B, about 66 GB, on 2), written to DIR if
# missing, served by examples/server with -tp TP at the checkpoint's full
# context and driven by cmd/loadgen through gpubench's serving mode
# (400-word prompts, 128 output tokens, each load its own prompt seed).
# c1's TPOT is decode at batch 1, c64's about batch 64: compare them with
# the per-GPU bandwidth bound (a GPU reads 1/TP of the weights a token).
# Build here, carry bin/:
#
#   for p in gpubench:./cmd/gpubench server:./examples/server loadgen:./cmd/loadgen; do
#     CGO_ENABLED=0 go build -ldflags='-s -w' -o bin/${p%%:*} ${p#*:}; done
#   sh cmd/gpubench/tp_big.sh OUT [SHAPE [TP [DIR [LOADS]]]]
#
# Defaults: llama70b, 4, /tmp/llama70b, c1:16,c64:192,c256:384. Writing
# the 70B checkpoint takes a few minutes and 141 GB of disk (df first).
set -u
out=$1
shape=${2:-llama70b}
tp=${3:-4}
dir=${4:-/tmp/$shape}
loads=${5:-c1:16,c64:192,c256:384}
bin=${BIN:-bin}
py=${PYTHON:-python3}
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$out/env.txt"
df -h "$(dirname "$dir")" | tee -a "$out/env.txt"
start=$(date +%s)
"$bin/gpubench" -serving -shape "$shape" -python "$py" -dir "$dir" -logs "$out" \
	-server "$bin/server" -loadgen "$bin/loadgen" -loads "$loads" -- -tp "$tp" 2>&1 | tee "$out/serving-$shape-tp$tp.txt"
echo "rc=$? after $(($(date +%s) - start)) s"
