#!/bin/sh
# One device run: environment, the benchmark table, and profiles of decode
# steps. Expects the gpubench binary in bin/ (Go is not needed there):
#
#   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o bin/gpubench ./cmd/gpubench
#   sh cmd/gpubench/device.sh OUTDIR [gpubench flags]
#
# Optional: bin/pyproc.test (go test -c ./engine/pyproc) runs the package's
# tests on the GPU first; bin/gpubench-base and bin/base_runtime/ (an older build and its
# runtime *.py) are measured and profiled first, for before/after figures.
set -u
out=${1:-/tmp/gpubench-out}
shift || true
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
ck=/tmp/llama1b
prof=cmd/gpubench/prof.py
{
	nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
	$py -c 'import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)'
	command -v go || echo "no go"
} 2>&1 | tee "$out/env.txt"
if [ -x bin/gpubench-base ]; then
	bin/gpubench-base -python "$py" -dir $ck -hf=false 2>&1 | tee "$out/base.txt"
	for b in 1 64; do
		$py $prof bin/base_runtime $ck $b 1 2>&1 | tee -a "$out/prof_before.txt"
	done
fi
if [ -x bin/pyproc.test ]; then # the package's tests on the GPU
	(cd engine/pyproc && MLXSERVING_PYTHON=$py MLXSERVING_TEST_DEVICE=cuda ../../bin/pyproc.test \
		-test.run 'Lookahead|Batched|Reference|Sampling|Prefix|Deterministic|Conformance|ThroughServer|RuntimeKernels' -test.count=1) 2>&1 | tail -30 | tee "$out/tests.txt"
fi
[ -n "${TUNE:-}" ] && $py cmd/gpubench/attn_tune.py engine/pyproc/runtime 2>&1 | tee "$out/tune.txt"
if [ -n "${NOBENCH:-}" ]; then # just write the checkpoint
	bin/gpubench -python "$py" -dir $ck -batches 1 -gen 1 -prefill "" -hf=false -hfstatic=false -stack=false >/dev/null 2>&1
else
	bin/gpubench -python "$py" -dir $ck "$@" 2>&1 | tee "$out/bench.txt"
fi
for b in 1 64; do
	$py $prof engine/pyproc/runtime $ck $b 8 2>&1 | tee -a "$out/prof_after.txt"
done
$py $prof engine/pyproc/runtime $ck 1 0 2>&1 | tee -a "$out/prof_after.txt"
