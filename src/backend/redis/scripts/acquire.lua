-- KEYS: lock, fence, queue, alive
-- ARGV: token, ttl_ms, host, pid, waiter_id ('' if not waiting), alive_ms
-- Returns {1, fence} when acquired, or {0, host, pid, since_ms, fence, pttl} when busy.
local bad = bad_ms('ttl_ms', ARGV[2], 1) or bad_ms('alive_ms', ARGV[6], 1)
if bad then return redis.error_reply(bad) end
local pttl = redis.call('PTTL', KEYS[1])
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if pttl ~= -2 then
  if pttl == -1 then
    -- A lock without an expiry would be held forever: it expires after the longest
    -- lease lockrun ever takes, and waiters are told so (they wait, not spin).
    redis.call('PEXPIRE', KEYS[1], MAX_MS)
    pttl = MAX_MS
  end
  if ARGV[5] ~= '' then
    -- Join (or stay in) the queue of waiters, and say this waiter is alive. Each key
    -- gets its expiry right after its write, so a failing later step (a key of the
    -- wrong type, written by hand) cannot leave one without.
    redis.call('ZADD', KEYS[3], 'NX', now_us, ARGV[5])
    redis.call('PEXPIRE', KEYS[3], ARGV[6] * 2)
    redis.call('HSET', KEYS[4], ARGV[5], string.format('%.0f', math.floor(now_us / 1000) + tonumber(ARGV[6])))
    redis.call('PEXPIRE', KEYS[4], ARGV[6] * 2)
  end
  local h = redis.call('HMGET', KEYS[1], 'host', 'pid', 'since_ms', 'fence')
  return {0, h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl}
end
-- The fencing token never goes below the server clock in microseconds, so it keeps
-- growing after the counter was lost (expired, restart without data, FLUSHALL), and
-- never below the last token + 1.
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local fence = now_us
if last >= fence then fence = last + 1 end
local fs = string.format('%.0f', fence)
-- Leave the queue first: these only remove, and a failure here writes nothing.
if ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[5])
  redis.call('HDEL', KEYS[4], ARGV[5])
end
-- Each write carries its expiry in the same command, or is followed at once by it:
-- the counter is SET with PX, and the lock hash did not exist (PTTL -2), so neither
-- HSET nor the PEXPIRE with its checked argument can fail in between.
redis.call('SET', KEYS[2], fs, 'PX', FENCE_KEEP_MS)
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fs, 'host', ARGV[3], 'pid', ARGV[4],
  'since_ms', string.format('%.0f', math.floor(now_us / 1000)))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fs}
