#!/bin/sh
# A before/after from one device call: gpubench's decode microbenchmark
# under two or more worker environments (the runtime's measurement
# switches, MLXSERVING_*), one binary, the variants alternating for
# ROUNDS rounds (default 2), so the machine's drift falls on every side.
# Prints each run's decode lines, then per batch each variant's runs and
# mean tok/s and the ratio of that mean to the first variant's.
#
#   sh cmd/gpubench/ab.sh 'VARIANT' 'VARIANT' ... -- GPUBENCH_FLAGS
#
# A variant is NAME=VALUE words for the worker's environment ('' for
# none), e.g.:
#
#   sh cmd/gpubench/ab.sh '' 'MLXSERVING_ATTN_SHORT_SPLITS=1' -- \
#     -shape llama8b -quant fp8 -dir /tmp/l8fp8 -batches 1,8 -gen 64 \
#     -prefill= -hf=false -hfstatic=false -stack=false
#
# GPUBENCH names the binary (default bin/gpubench); OUT, where each run's
# whole output goes (default a temporary folder).
set -u
n=0
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
	n=$((n + 1))
	eval "v$n=\$1"
	shift
done
[ $# -gt 0 ] && shift
if [ "$n" -lt 2 ]; then
	echo "usage: ab.sh 'VARIANT' 'VARIANT' ... -- GPUBENCH_FLAGS" >&2
	exit 2
fi
bin=${GPUBENCH:-bin/gpubench}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
rounds=${ROUNDS:-2}
sum="$out/ab.tsv"
: >"$sum"
r=1
while [ "$r" -le "$rounds" ]; do
	i=1
	while [ "$i" -le "$n" ]; do
		eval "v=\$v$i"
		log="$out/v$i.r$r.txt"
		# shellcheck disable=SC2086 # a variant is words
		env $v "$bin" "$@" >"$log" 2>&1 || echo "variant $i round $r: gpubench failed (see $log)"
		echo "variant $i [${v:-default}] round $r: $(grep 'engine decode' "$log" | sed 's/^engine decode //; s/ tokens\/s.*//' | tr '\n' ' ')"
		grep 'engine decode batch' "$log" | awk -v i="$i" '{print i "\t" $4 "\t" $5}' | tr -d ':' >>"$sum"
		i=$((i + 1))
	done
	r=$((r + 1))
done
echo
echo "| batch | variant | runs (tok/s) | mean | vs variant 1 |"
echo "|---|---|---|---|---|"
i=1
while [ "$i" -le "$n" ]; do
	eval "v=\$v$i"
	echo "$i	${v:-default}"
	i=$((i + 1))
done >"$out/names.tsv"
awk -F'\t' '
	FILENAME ~ /names/ { name[$1] = $2; next }
	{ runs[$2, $1] = runs[$2, $1] (runs[$2, $1] == "" ? "" : " / ") $3; s[$2, $1] += $3; c[$2, $1]++
	  if (!($2 in seen)) { seen[$2] = 1; order[++nb] = $2 } if ($1 > nv) nv = $1 }
	END {
		for (k = 1; k <= nb; k++) {
			b = order[k]; base = s[b, 1] / c[b, 1]
			for (i = 1; i <= nv; i++) if (c[b, i])
				printf "| %s | %d: %s | %s | %.1f | %.3fx |\n", b, i, name[i], runs[b, i], s[b, i] / c[b, i], (s[b, i] / c[b, i]) / base
		}
	}' "$out/names.tsv" "$sum"
