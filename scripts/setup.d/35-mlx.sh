# MLX + mlx-c for the MLX engine's tests (engine/mlx, internal/metal, build
# tag mlx). Sourced by scripts/test.sh. Uses, in order:
#   MLXSERVING_MLX_PREFIX  an installed prefix (include/mlx/c, lib/libmlxc.so)
#                          when it holds mlx-c; otherwise where to build it
#                          (default ~/.cache/mlxserving/mlx-0.31.2-cpu,
#                          outside the clone so a new clone reuses it)
#   MLXSERVING_MLX_BUNDLE  the source bundle to build from (build.sh and its
#                          tarballs; default ../shared/mlx beside the clone)
# The first build takes 8-10 minutes on 2 cores; later runs find the
# bundle's stamp in the prefix and take no time.
#
# Exports:
#   MLXSERVING_MLX   1 when MLX is there and the mlx-tagged tests run
#   CGO_CFLAGS, CGO_LDFLAGS  pointing at the prefix
_mlx_prefix="${MLXSERVING_MLX_PREFIX:-$HOME/.cache/mlxserving/mlx-0.31.2-cpu}"
_mlx_bundle="${MLXSERVING_MLX_BUNDLE:-$MLXSERVING_ROOT/../shared/mlx}"
export MLXSERVING_MLX=0
if [ ! -f "$_mlx_prefix/include/mlx/c/mlx.h" ] || [ -f "$_mlx_bundle/build.sh" ]; then
  if [ -f "$_mlx_bundle/build.sh" ]; then
    echo "35-mlx: MLX + mlx-c from $_mlx_bundle into $_mlx_prefix (minutes the first time)"
    if ! bash "$_mlx_bundle/build.sh" cpu "$_mlx_prefix" >"$MLXSERVING_ROOT/.cache/mlx-build.log" 2>&1; then
      echo "35-mlx: the MLX build failed; see .cache/mlx-build.log" >&2
      tail -20 "$MLXSERVING_ROOT/.cache/mlx-build.log" >&2
      if [ -n "${CI:-}" ]; then return 1 2>/dev/null || exit 1; fi
    fi
  fi
fi
if [ -f "$_mlx_prefix/include/mlx/c/mlx.h" ] && [ -f "$_mlx_prefix/lib/libmlxc.so" ]; then
  export CGO_CFLAGS="-I$_mlx_prefix/include ${CGO_CFLAGS:-}"
  export CGO_LDFLAGS="-L$_mlx_prefix/lib -Wl,-rpath,$_mlx_prefix/lib ${CGO_LDFLAGS:-}"
  export MLXSERVING_MLX=1
else
  echo "35-mlx: no MLX (no bundle at $_mlx_bundle, no prefix at $_mlx_prefix): the mlx-tagged tests do not run" >&2
fi
unset _mlx_prefix _mlx_bundle
