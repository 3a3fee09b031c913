# Redis for balancer/redisaffinity's tests: they start their own
# redis-server on a loopback port (no persistence). Sourced by
# scripts/test.sh; quick when present.
if ! command -v redis-server >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server >/dev/null ||
      echo "50-redis: apt-get install redis-server failed" >&2
  else
    echo "50-redis: redis-server missing; run as root with apt-get, or install redis-server" >&2
  fi
fi
