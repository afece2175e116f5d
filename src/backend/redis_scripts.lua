-- lockrun's Redis scripts. Each runs atomically on the server. Keys of one lock share
-- the hash tag {NAME}, so they live in one Redis Cluster slot.
-- This file is documentation and the source of the strings in redis.rs (include_str!),
-- split at the "--@" markers.

--@wake_fn
-- Prepended to the scripts that free a lock: wake the longest-waiting live waiter,
-- and only it (no thundering herd). Waiters whose heartbeat ran out are dropped.
local function wake_one(queue, alive, prefix)
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _ = 1, 16 do
    local head = redis.call('ZRANGE', queue, 0, 0)
    if #head == 0 then return end
    local until_ms = tonumber(redis.call('HGET', alive, head[1]) or '0') or 0
    if until_ms >= now_ms then
      redis.call('PUBLISH', prefix .. head[1], 'released')
      return
    end
    redis.call('ZREM', queue, head[1])
    redis.call('HDEL', alive, head[1])
  end
end

--@acquire
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

--@renew
-- KEYS: lock. ARGV: token, ttl_ms. Returns 1 if extended, 0 if not ours.
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0

--@release
-- KEYS: lock, queue, alive. ARGV: token, keep_ms, wake channel prefix.
-- Returns 1 if released (or shortened to keep_ms), 0 if not ours.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
wake_one(KEYS[2], KEYS[3], ARGV[3])
return 1

--@fence_floor
-- KEYS: fence, lock. ARGV: fencing token, owner token.
-- Redlock: raise this server's counter to the token the quorum handed out, and record
-- it on our lock entry, so every majority afterwards answers with a larger one.
local last = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if last < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
if redis.call('HGET', KEYS[2], 'token') == ARGV[2] then
  redis.call('HSET', KEYS[2], 'fence', ARGV[1])
end
return 1

--@leave
-- KEYS: queue, alive. ARGV: waiter_id.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1

--@inspect
-- KEYS: lock. Returns {host, pid, since_ms, fence, pttl} of the holder, or {}.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return {} end
local h = redis.call('HMGET', KEYS[1], 'host', 'pid', 'since_ms', 'fence')
return {h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl}

--@force
-- KEYS: lock, queue, alive. ARGV: wake channel prefix.
-- Deletes the lock whoever holds it and wakes one waiter. Returns what --@inspect
-- returns, about the holder it removed.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return {} end
local h = redis.call('HMGET', KEYS[1], 'host', 'pid', 'since_ms', 'fence')
redis.call('DEL', KEYS[1])
wake_one(KEYS[2], KEYS[3], ARGV[1])
return {h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl}
