#!/bin/sh
# Each family against transformers on the GPU machine (Go is not needed
# there). Build here, then carry bin/:
#
#   CGO_ENABLED=0 go build -o bin/familycheck ./internal/familycheck
#   go build -tags mlx -o bin/familycheck-mlx ./internal/familycheck   # optional: the MLX engine too
#   bin/tok/tokenizer.json, tokenizer_config.json   # any tokenizer (testmodel's): engines load one
#
#   sh internal/familycheck/device.sh mlxbuild MLXSRC   # optional: MLX's CUDA build in the background (~8 min)
#   sh internal/familycheck/device.sh build OUT [family ...]     # checkpoints and transformers' references
#   sh internal/familycheck/device.sh run OUT ENGINE [family ...] # ENGINE pyproc, pyproc-one (a prompt at a time) or mlx, both dtypes
#   sh internal/familycheck/device.sh compare OUT
#
# Embeddings (the pyproc engine's pooled vectors against transformers'
# last_hidden_state pooled in hf_embed.py; bin/tok as above):
#
#   sh internal/familycheck/device.sh embed-build OUT [shape ...]   # bge-base, qwen3-embedding-0.6b, modernbert-base
#   sh internal/familycheck/device.sh embed-run OUT [shape ...]     # float32 and bfloat16
#   sh internal/familycheck/device.sh embed-compare OUT             # max abs diff and cosine per pooling
#   sh internal/familycheck/device.sh embed-bench OUT [shape ...]   # embeddings/s: batches of 64 inputs of 128 tokens, bfloat16
set -u
here=$(dirname "$0")
py=${PYTHON:-python3}
data=/tmp/familycheck
prefix=/tmp/mlx-cuda
cmd=$1
shift
case "$cmd" in
mlxbuild)
	setsid sh -c "bash '$1/build.sh' cuda $prefix > /tmp/mlx-cuda-build.log 2>&1; echo rc=\$? >> /tmp/mlx-cuda-build.log" < /dev/null > /dev/null 2>&1 &
	echo "building MLX (cuda) into $prefix in the background" ;;
build)
	out=$1
	shift
	mkdir -p "$out"
	{
		nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
		$py -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "grouped_mm", hasattr(torch, "_grouped_mm"))'
	} 2>&1 | tee "$out/env.txt"
	$py "$here/hf_families.py" build $data "$@" 2>&1 | grep -v Warning | tee -a "$out/build.txt"
	# The engines load a checkpoint with its tokenizer: any will do for
	# token-id prompts (bin/tok: testmodel's, written by a Go test or tool).
	for d in $data/*/float32 $data/*/bfloat16; do cp bin/tok/tokenizer.json bin/tok/tokenizer_config.json "$d"/; done ;;
run)
	out=$1 eng=$2
	shift 2
	fams=${*:-$(ls $data)}
	bin=bin/familycheck
	flags="-engine $eng"
	# pyproc-one: the prompts one at a time, so decode runs the one-row products
	[ "$eng" = pyproc-one ] && flags="-engine pyproc -one"
	if [ "$eng" = mlx ]; then
		bin=bin/familycheck-mlx
		while ! grep -q '^rc=' /tmp/mlx-cuda-build.log 2>/dev/null; do sleep 5; done
		tail -2 /tmp/mlx-cuda-build.log | tee "$out/mlx-build.txt"
		export LD_LIBRARY_PATH=$prefix/lib
	fi
	for f in $fams; do
		for dt in float32 bfloat16; do
			[ -d $data/$f/$dt ] || continue
			[ -s $data/$f/$eng-$dt.json ] && continue # done by an earlier call
			start=$(date +%s)
			$bin $flags -dir $data/$f/$dt -in $data/$f/prompts.json -n 32 -dtype $dt -python "$py" \
				> $data/$f/$eng-$dt.json 2> "$out/$f-$eng-$dt.err"
			echo "$f $eng $dt rc=$? $(($(date +%s) - start))s" | tee -a "$out/runs.txt"
			tail -3 "$out/$f-$eng-$dt.err"
		done
	done ;;
compare)
	$py "$here/hf_families.py" compare $data | tee "$1/table.md" ;;
embed-build)
	out=$1
	shift
	mkdir -p "$out"
	$py "$here/hf_embed.py" build $data-embed "$@" 2>&1 | grep -v Warning | tee -a "$out/embed-build.txt"
	for d in $data-embed/*/float32 $data-embed/*/bfloat16; do cp bin/tok/tokenizer.json bin/tok/tokenizer_config.json "$d"/; done ;;
embed-run)
	out=$1
	shift
	for s in ${*:-$(ls $data-embed)}; do
		for dt in float32 bfloat16; do
			[ -d $data-embed/$s/$dt ] || continue
			start=$(date +%s)
			bin/familycheck -embed -dir $data-embed/$s/$dt -in $data-embed/$s/inputs.json -dtype $dt -python "$py" \
				> $data-embed/$s/pyproc-$dt.json 2> "$out/embed-$s-$dt.err"
			echo "$s embed $dt rc=$? $(($(date +%s) - start))s" | tee -a "$out/embed-runs.txt"
			tail -3 "$out/embed-$s-$dt.err"
		done
	done ;;
embed-compare)
	$py "$here/hf_embed.py" compare $data-embed | tee "$1/embed-table.md" ;;
embed-bench)
	out=$1
	shift
	for s in ${*:-$(ls $data-embed)}; do
		[ -d $data-embed/$s/bfloat16 ] || continue
		printf '%s ' "$s" | tee -a "$out/embed-bench.txt"
		bin/familycheck -bench 64 -bench-tokens 128 -bench-seconds 20 -dir $data-embed/$s/bfloat16 -dtype bfloat16 -python "$py" \
			2> "$out/embed-bench-$s.err" | tee -a "$out/embed-bench.txt"
	done ;;
esac
