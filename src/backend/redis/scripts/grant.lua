-- Prepended to the release script (after args.lua, limit.lua and evict.lua): a
-- release grants the slot it frees to the waiter it wakes, when that waiter asked for
-- grants, so that the next holder's command starts without one more round trip. The
-- acquire script keeps what a grant needs in the alive hash (`g:ID`: ttl_ms, alive_ms,
-- pid, allow_eviction, N, token, host); the slot is taken for the waiter here with the
-- writes the acquire script makes (same fields, same fencing counter, the same expiry
-- before and after the write), it leaves the queue, and its wake-up message says
-- `granted FENCE SLOT TOKEN16` (the first 16 characters of the token granted).
-- A slot is granted only to a waiter that
-- - is listening: its channel has a subscriber on this server (`PUBSUB NUMSUB`, asked
--   before anything is written, so a grant never has to be undone after its message
--   went out: a message published here also reaches replicas and, in a Cluster, every
--   node). A waiter that died has no connection left, and is not granted a lease;
-- - was heard from within half its heartbeat: a waiter asks at least every 2 s, so a
--   waiter that froze or lost its host some time ago is woken, as before, not granted;
-- - would have been allowed the slot by the acquire script: the same N, and a server
--   that may not evict the lock unless the waiter allows it.
-- Otherwise the waiter is woken as before and asks for the slot itself. The waiter
-- counts its lease from the moment it sent its last attempt that found the lock busy
-- (the grant comes after that attempt reached the server). A waiter whose message is
-- lost finds the slot held with its own token at its next attempt, and takes it then
-- (the acquire script).
-- Returns a function(id, until_ms, now_ms) for wake(): true when the slot (`key`, slot
-- `slot` of `n`) is now waiter `id`'s and it has been told so.
local function granter(keys, key, slot, n, prefix)
  return function(id, until_ms, now_ms)
    local spec = redis.call('HGET', keys.alive, 'g:' .. id)
    if not spec then return false end
    local ttl, alive_ms, pid, allow, wn, token, host = string.match(spec,
      '^(%d+) (%d+) (%d+) ([01]) (%d+) (%x+) (.*)$')
    if not ttl or bad_ms('ttl_ms', ttl, 1) or bad_ms('alive_ms', alive_ms, 1)
        or tonumber(wn) ~= n or #token > 64 or #pid > 10 then
      return false
    end
    if until_ms - now_ms < tonumber(alive_ms) / 2 then return false end
    local listeners = redis.pcall('PUBSUB', 'NUMSUB', prefix .. id)
    if type(listeners) ~= 'table' or (tonumber(listeners[2]) or 0) < 1 then return false end
    if allow ~= '1' and eviction() == 'evicts' then return false end
    local t = redis.call('TIME')
    local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local last = tonumber(redis.call('GET', keys.fence) or '0') or 0
    local fence = now_us
    if last >= fence then fence = last + 1 end
    local fs = string.format('%.0f', fence)
    redis.call('PEXPIRE', key, ttl)
    redis.call('SET', keys.fence, fs, 'PX', FENCE_KEEP_MS)
    local fields = {'token', token, 'fence', fs, 'host', host, 'pid', pid,
      'since_ms', string.format('%.0f', math.floor(now_us / 1000))}
    if n > 1 then
      for _, f in ipairs({'slot', slot, 'slots', n}) do fields[#fields + 1] = f end
    end
    redis.call('HSET', key, unpack(fields))
    redis.call('PEXPIRE', key, ttl)
    if n > 1 then cover_limit(keys.limit, n, ttl) end
    redis.call('ZREM', keys.queue, id)
    redis.call('HDEL', keys.alive, id, 'w:' .. id, 'g:' .. id)
    redis.call('PUBLISH', prefix .. id, 'granted ' .. fs .. ' ' .. slot .. ' ' ..
      string.sub(token, 1, 16))
    return true
  end
end
