#!/bin/sh
# Run by lockrun: write the result only if no holder with a newer fencing token has
# written already. The check and the write are one Lua script, so they are atomic.
set -eu
: "${LOCKRUN_FENCING_TOKEN:?run me under lockrun}"
reply=$(redis-cli -u "${DATA_REDIS_URL:-redis://127.0.0.1:6379}" EVAL "
  local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
  if tonumber(ARGV[1]) <= last then return 'stale' end
  redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'body', ARGV[2])
  return 'written'" 1 report:result "$LOCKRUN_FENCING_TOKEN" "made at $(date -u +%FT%TZ)")
if [ "$reply" != written ]; then
  echo "stale fencing token $LOCKRUN_FENCING_TOKEN: a newer holder has written; nothing changed ($reply)" >&2
  exit 1
fi
echo "wrote the result with fencing token $LOCKRUN_FENCING_TOKEN"
