#!/bin/sh
# The MLX engine on a CUDA machine, beside the torch engine, in two calls
# to the same machine (Go is not needed there). Build here:
#
#   CGO_ENABLED=0 go build -o BIN/gpubench ./cmd/gpubench
#   go build -tags mlx -o BIN/mlxbench ./cmd/mlxbench   # against any MLX prefix's headers
#
# and carry BIN and a copy of the MLX source bundle (../shared/mlx) as MLXSRC.
#
#   sh cmd/mlxbench/device.sh build MLXSRC      # starts the CUDA build (about 8 minutes), returns
#   sh cmd/mlxbench/device.sh bench BIN OUTDIR  # waits for it, then both engines' decode table
#                                                                # (the MLX engine with and without its fused kernels)
#   sh cmd/mlxbench/device.sh profile BIN OUTDIR BATCH  # the kernels of 4 decode steps at BATCH (ncu)
#   sh cmd/mlxbench/device.sh quant BIN OUTDIR [SHAPE ...]  # bf16 vs MLX 4/8-bit vs AWQ vs FP8 decode
#                                                                # (llama1b, llama8b by default)
#
# mlxbench finds the CUDA build's libmlxc.so through LD_LIBRARY_PATH (it
# takes precedence over the RUNPATH of the prefix it was linked against;
# both builds are MLX 0.31.2 with the same C API).
set -u
prefix=/tmp/mlx-cuda
case "$1" in
build)
	setsid sh -c "bash '$2/build.sh' cuda $prefix > /tmp/mlx-cuda-build.log 2>&1; echo rc=\$? >> /tmp/mlx-cuda-build.log" < /dev/null > /dev/null 2>&1 &
	echo "building MLX (cuda) into $prefix in the background" ;;
bench)
	bin=$2 out=$3
	mkdir -p "$out"
	while ! grep -q '^rc=' /tmp/mlx-cuda-build.log 2>/dev/null; do sleep 5; done
	tail -3 /tmp/mlx-cuda-build.log | tee "$out/mlx-build.txt"
	LD_LIBRARY_PATH=$prefix/lib "$bin/mlxbench" -dir /tmp/llama1b -batches 1,8,32,64 2>&1 | tee "$out/mlx.txt"
	# the same binary without the fused decode kernels (MLX ops instead)
	LD_LIBRARY_PATH=$prefix/lib "$bin/mlxbench" -fused=false -dir /tmp/llama1b -batches 1,8,32,64 2>&1 | tee "$out/mlx-unfused.txt"
	"$bin/gpubench" -python python3 -dir /tmp/llama1b -batches 1,8,32,64 -prefill "" -hf=false -hfstatic=false -stack=false 2>&1 | tee "$out/torch.txt" ;;
quant)
	bin=$2 out=$3
	shift 3
	mkdir -p "$out"
	while ! grep -q '^rc=' /tmp/mlx-cuda-build.log 2>/dev/null; do sleep 5; done
	for s in ${*:-llama1b llama8b}; do
		for q in bf16 mlx4 mlx8 awq fp8; do
			flag="-quant $q"
			[ $q = bf16 ] && flag=""
			LD_LIBRARY_PATH=$prefix/lib "$bin/mlxbench" -shape $s $flag -dir /tmp/mlxq-$s-$q -batches 1,8,64 2>&1 | tee "$out/mlx-$s-$q.txt"
			rm -rf /tmp/mlxq-$s-$q
		done
	done ;;
profile)
	bin=$2 out=$3 b=${4:-64}
	mkdir -p "$out"
	while ! grep -q '^rc=' /tmp/mlx-cuda-build.log 2>/dev/null; do sleep 5; done
	ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
	LD_LIBRARY_PATH=$prefix/lib "$ncu" --profile-from-start off --metrics gpu__time_duration.sum --csv \
		"$bin/mlxbench" -dir /tmp/llama1b -batches "$b" -gen 4 -gpuprofile > "$out/ncu-b$b.csv" 2> "$out/ncu-b$b.err"
	python3 "$(dirname "$0")/ncusum.py" "$out/ncu-b$b.csv" 4 | tee "$out/ncu-b$b.txt" ;;
esac
