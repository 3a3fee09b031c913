#!/bin/sh
# Quantized checkpoints on the GPU machine (Go is not needed there). Build
# here, then carry bin/:
#
#   CGO_ENABLED=0 go build -o bin/familycheck ./internal/familycheck
#   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o bin/gpubench ./cmd/gpubench
#   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o bin/pyproc.test ./engine/pyproc   # optional
#
#   sh internal/familycheck/quant.sh check OUT   # kernels, then each layout against the references
#   sh internal/familycheck/quant.sh bench OUT [llama1b llama8b]   # decode and prefill tok/s, bf16 vs FP8 vs int4
#
# check: the Triton GEMMs against the dequantized product
# (engine/pyproc/testdata/quant_test.py), the package's quantized tests on
# the GPU when bin/pyproc.test is there, then for each layout (and
# -quantize fp8 on the float checkpoint) the engine's greedy tokens in
# bfloat16 (quantized kernels) and float32 (dequantized at load) against
# reference.py's dequantized float64 forward and transformers
# (quant_check.py); the table goes to OUT/quant-table.md.
# bench: gpubench -quant per layout, decode at batch 1 and 64 and prefill
# (OUT/bench-SHAPE-Q.txt; the FP8 layouts again with W8A8 off,
# OUT/bench-SHAPE-Q-weightonly.txt),
# each checkpoint written, measured and removed in turn (llama8b's bf16
# file is 16 GB).
set -u
here=$(dirname "$0")
py=${PYTHON:-python3}
data=/tmp/quantcheck
cmd=$1 out=$2
shift 2
mkdir -p "$out" $data
export PYTHONUNBUFFERED=1
case "$cmd" in
check)
	{
		nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
		$py -c 'import torch, transformers, triton; print("torch", torch.__version__, "transformers", transformers.__version__, "triton", triton.__version__)'
	} 2>&1 | tee "$out/env.txt"
	$py engine/pyproc/testdata/quant_test.py engine/pyproc/runtime 2>&1 | tail -5 | tee "$out/kernels.txt"
	if [ -x bin/pyproc.test ]; then
		(cd engine/pyproc && MLXSERVING_PYTHON=$py MLXSERVING_TEST_DEVICE=cuda ../../bin/pyproc.test \
			-test.run 'Quant' -test.count=1 -test.v) 2>&1 | grep -E '^(---|ok|FAIL|PASS)' | tee "$out/tests.txt"
	fi
	$py "$here/quant_check.py" prompts $data/prompts.json
	$py "$here/quant_check.py" header > "$out/quant-table.md"
	for q in float fp8 fp8-channel awq gptq; do
		bin/familycheck -write $q -dir $data/$q || exit 1
	done
	for q in float fp8 fp8-channel awq gptq quantize-fp8; do
		dir=$data/$q opt=""
		[ $q = quantize-fp8 ] && dir=$data/float opt="-quantize fp8"
		for dt in bfloat16 float32; do
			# weight-only: the table's tolerance is bf16's (W8A8, off here, is
			# checked against its own by TestQuantW8A8CUDA above)
			bin/familycheck -engine pyproc -fp8-scaled-mm=false -dir $dir $opt -in $data/prompts.json -n 16 -dtype $dt -python "$py" \
				> $data/$q-$dt.json 2> "$out/$q-$dt.err" || { echo "$q $dt: engine failed"; tail -5 "$out/$q-$dt.err"; continue; }
			fl=""
			[ $q != float ] && fl=$data/float
			$py "$here/quant_check.py" check $dir $data/$q-$dt.json $data/prompts.json "$q ($dt)" $fl 2>>"$out/check.err" \
				| tee -a "$out/quant-table.md"
		done
	done ;;
bench)
	shapes=${*:-llama1b llama8b}
	for s in $shapes; do
		for q in bf16 fp8 fp8-channel awq gptq quantize-fp8; do
			dir=$data/$s-$q flag="-quant $q"
			case $q in bf16) flag="" ;; quantize-fp8) dir=$data/$s-bf16 ;; esac
			bin/gpubench -python "$py" -shape $s -dir $dir $flag -batches 1,64 -gen 64 -prefill 1x2048,16x512 \
				-hf=false -hfstatic=false -stack=false 2>&1 | tee "$out/bench-$s-$q.txt" | grep -E '^\| [0-9]|loaded'
			case $q in fp8*|quantize-fp8) # again weight-only: W8A8 (products of 16+ rows) off
				bin/gpubench -fp8-scaled-mm=false -python "$py" -shape $s -dir $dir $flag -batches 1,64 -gen 64 \
					-prefill 1x2048,16x512 -hf=false -hfstatic=false -stack=false 2>&1 | tee "$out/bench-$s-$q-weightonly.txt" | grep -E '^\| [0-9]|loaded' ;;
			esac
			case $q in bf16 | quantize-fp8) ;; *) rm -rf "$dir" ;; esac
		done
		rm -rf $data/$s-bf16
	done
	grep -h -E '^decode|^\| (1|64) \|' "$out"/bench-*.txt > "$out/bench-summary.txt" ;;
*)
	echo "usage: quant.sh check|bench OUT [shape ...]" >&2
	exit 2 ;;
esac
