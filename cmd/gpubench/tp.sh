#!/bin/sh
# Tensor parallel on a machine with 2 GPUs (torch 2.x with CUDA and NCCL):
# an 8B-shaped bf16 checkpoint with random weights (testmodel.Llama8B),
# tensor parallel 2 against one GPU: greedy tokens of 8 sequences (the
# first position where they part), then decode tok/s at batch 1 and 64,
# alternating, 3 rounds; then the greedy check again with CUDA graphs off
# under tensor parallel only (MLXSERVING_TP_GRAPHS=0), which tells the
# graph path (NCCL collectives captured) from the eager one. Build here,
# carry bin/:
#
#   CGO_ENABLED=0 go build -o bin/gpubench ./cmd/gpubench
#   sh cmd/gpubench/tp.sh [DIR]      # DIR: the checkpoint, written if missing (default /tmp/llama8b)
#
# Writing the checkpoint (16 GB) takes a minute or two; the comparison
# under five minutes.
set -eu
dir=${1:-/tmp/llama8b}
py=${PYTHON:-python3}
nvidia-smi --query-gpu=index,name,memory.total --format=csv
$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
start=$(date +%s)
bin/gpubench -python "$py" -shape llama8b -dir "$dir" -tp 2 -batches 1,64 -prompt 128 -gen 128
echo "--- greedy with CUDA graphs off under tensor parallel"
MLXSERVING_TP_GRAPHS=0 bin/gpubench -python "$py" -shape llama8b -dir "$dir" -tp 2 -batches "" -gen 128
echo "total $(( $(date +%s) - start ))s"
