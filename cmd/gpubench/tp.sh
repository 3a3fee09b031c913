#!/bin/sh
# Tensor parallel on a machine with 2 GPUs (torch 2.x with CUDA and NCCL):
# an 8B-shaped bf16 checkpoint with random weights (testmodel.Llama8B),
# tensor parallel 2 against one GPU, both loaded side by side: greedy
# tokens of 8 sequences of 128 (the first position where tp 2 parts from
# tp 1), then decode tok/s at batch 1 and 64, alternating, 3 rounds. Then
# the greedy check again with CUDA graphs off under tensor parallel only
# (-tp-graphs=false): the graph path captures the NCCL collectives,
# which only a GPU run shows working; if the first run fails or hangs
# there, the second tells whether the eager path is right. Build here,
# carry bin/:
#
#   CGO_ENABLED=0 go build -o bin/gpubench ./cmd/gpubench
#   sh cmd/gpubench/tp.sh [DIR]      # DIR: the checkpoint, written if missing (default /tmp/llama8b)
#
# Each run is bounded (timeout); writing the 16 GB checkpoint comes first.
set -u
dir=${1:-/tmp/llama8b}
py=${PYTHON:-python3}
nvidia-smi --query-gpu=index,name,memory.total --format=csv
$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
start=$(date +%s)
limit=420
[ -f "$dir/config.json" ] || limit=780 # the checkpoint is written first (about 40 s a 2.4 GB here)
echo "--- tp 2 against tp 1, CUDA graphs on"
timeout $limit bin/gpubench -python "$py" -shape llama8b -dir "$dir" -tp 2 -batches 1,64 -prompt 128 -gen 128
echo "rc=$? after $(( $(date +%s) - start ))s"
echo "--- greedy only, CUDA graphs off under tensor parallel"
timeout 180 bin/gpubench -tp-graphs=false -python "$py" -shape llama8b -dir "$dir" -tp 2 -batches "" -gen 128
echo "rc=$? total $(( $(date +%s) - start ))s"
