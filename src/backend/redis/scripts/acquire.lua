-- KEYS: lock, fence, queue, alive
-- ARGV: token, ttl_ms, host, pid, waiter_id ('' if not waiting), alive_ms
-- Returns {1, fence} when acquired, or {0, host, pid, since_ms, fence, pttl} when busy.
local pttl = redis.call('PTTL', KEYS[1])
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if pttl ~= -2 then
  if ARGV[5] ~= '' then
    -- Join (or stay in) the queue of waiters, and say this waiter is alive.
    redis.call('ZADD', KEYS[3], 'NX', now_us, ARGV[5])
    redis.call('HSET', KEYS[4], ARGV[5], string.format('%.0f', math.floor(now_us / 1000) + tonumber(ARGV[6])))
    redis.call('PEXPIRE', KEYS[3], ARGV[6] * 2)
    redis.call('PEXPIRE', KEYS[4], ARGV[6] * 2)
  end
  local h = redis.call('HMGET', KEYS[1], 'host', 'pid', 'since_ms', 'fence')
  return {0, h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl}
end
-- The fencing token never goes below the server clock in microseconds, so it keeps
-- growing after the counter was lost (restart without data, FLUSHALL), and never
-- below the last token + 1.
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local fence = now_us
if last >= fence then fence = last + 1 end
local fs = string.format('%.0f', fence)
redis.call('SET', KEYS[2], fs)
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fs, 'host', ARGV[3], 'pid', ARGV[4],
  'since_ms', string.format('%.0f', math.floor(now_us / 1000)))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[5])
  redis.call('HDEL', KEYS[4], ARGV[5])
end
return {1, fs}
