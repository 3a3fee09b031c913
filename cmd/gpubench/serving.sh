#!/bin/sh
# One device run of the serving table: examples/server on a bf16 random
# checkpoint at its full 131,072-token context, driven by cmd/loadgen, for
# each shape given (default llama1b), plus the decode microbenchmark at
# batch 1 and 64 on the 1B shape. Go is not needed on the device; build here:
#
#   for p in gpubench:./cmd/gpubench server:./examples/server loadgen:./cmd/loadgen; do
#     CGO_ENABLED=0 go build -ldflags='-s -w' -o bin/${p%%:*} ${p#*:}; done
#   sh cmd/gpubench/serving.sh OUTDIR [SHAPE...]
#
# LOADS overrides the loads (gpubench -loads); MICRO=0 skips the
# microbenchmark; SERVER_ARGS are passed to examples/server; BIN names the
# folder of the binaries (default bin).
set -u
out=${1:-/tmp/serving-out}
shift || true
shapes=${*:-llama1b}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
bin=${BIN:-bin}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/env.txt"
if [ "${MICRO:-1}" != 0 ]; then
	"$bin/gpubench" -python "$py" -dir /tmp/llama1b -batches 1,64 -prefill "" -hf=false -hfstatic=false -stack=false 2>&1 | tee "$out/micro.txt"
fi
for s in $shapes; do
	"$bin/gpubench" -serving -shape "$s" -python "$py" -dir "/tmp/$s" -logs "$out" \
		-server "$bin/server" -loadgen "$bin/loadgen" \
		${LOADS:+-loads "$LOADS"} -- ${SERVER_ARGS:-} 2>&1 | tee "$out/serving-$s.txt"
	mv "$out/server.log" "$out/server-$s.log" 2>/dev/null
done
