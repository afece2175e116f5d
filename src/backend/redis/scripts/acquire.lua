-- KEYS: fence, queue, alive, limit, then the N slot keys, slot 0 (the plain lock's key)
--   first.
-- ARGV: token, ttl_ms, host, pid, waiter_id ('' if not waiting), alive_ms, wanted slot
--   ('' or none: the lowest free one; Redlock asks for one slot in its second round),
--   allow_eviction ('1': --allow-eviction; '' or none: check the server's policy).
-- Returns {1, fence, slot, free} when acquired (free: one character per slot, '1' where
-- it was free); {0, host, pid, since_ms, fence, pttl, slot, slots} when busy (the holder
-- of the wanted slot, or the one whose lease ends first); {2, theirs} when a live holder
-- was taken with another --slots (theirs), and {3, policy, maxmemory} when the server
-- may evict the lock: nothing was written then. When the eviction check could not be
-- made, the acquired or busy answer comes as {4, why, answer}.
local bad = bad_ms('ttl_ms', ARGV[2], 1) or bad_ms('alive_ms', ARGV[6], 1)
if bad then return redis.error_reply(bad) end
local n = #KEYS - 4
local wanted = ARGV[7] or ''
if n < 1 or (wanted ~= '' and not (string.match(wanted, '^%d+$') and #wanted <= 4 and
    tonumber(wanted) < n)) then
  return redis.error_reply('ERR lockrun: the wanted slot must be a whole number below ' ..
    n .. ', not ' .. wanted)
end
local want = tonumber(wanted)
-- A server that may evict keys (maxmemory set, a policy other than noeviction; the
-- volatile-* ones too: the lock has an expiry) may drop the lock while it is held, and
-- a second holder gets in: refused, before anything is written, unless allowed. INFO
-- is read here, in the same round trip; a server that will not let the script read it
-- (an ACL without INFO) is told apart, and the lock is taken.
-- (A field is found by a plain search for its line: a pattern search would cost more
-- than INFO itself.)
local function info_field(info, name)
  local at = string.find(info, '\n' .. name .. ':', 1, true)
  return at and string.match(info, '^[%w_%-]+', at + #name + 2)
end
local unchecked = nil
if ARGV[8] ~= '1' then
  local info = redis.pcall('INFO', 'memory')
  if type(info) ~= 'string' then
    unchecked = tostring(type(info) == 'table' and info.err or info)
  else
    local max = info_field(info, 'maxmemory')
    local policy = info_field(info, 'maxmemory_policy')
    if not (max and string.match(max, '^%d+$') and policy) then
      unchecked = 'INFO memory shows no maxmemory or maxmemory_policy'
    elseif tonumber(max) ~= 0 and policy ~= 'noeviction' then
      return {3, policy, max}
    end
  end
end
local function answer(reply)
  if unchecked then return {4, unchecked, reply} end
  return reply
end
-- Every holder must have been taken with this N: two limits for one name would let
-- more in than the smaller one. Checked before anything is written.
local theirs = redis.call('GET', KEYS[4])
if theirs and tonumber(theirs) ~= n then return {2, theirs} end
local live, free, free_map = {}, nil, {}
for i = 0, n - 1 do
  local pttl = redis.call('PTTL', KEYS[5 + i])
  if pttl == -2 then
    free_map[i + 1] = '1'
    if free == nil and (want == nil or want == i) then free = i end
  else
    free_map[i + 1] = '0'
    local slots = redis.call('HGET', KEYS[5 + i], 'slots') or '1'
    if tonumber(slots) ~= n then return {2, slots} end
    live[#live + 1] = {i, pttl}
  end
end
-- A lock without an expiry would be held forever: it expires after the longest lease
-- lockrun ever takes, and waiters are told so (they wait, not spin).
local longest = 0
for _, l in ipairs(live) do
  if l[2] == -1 then
    redis.call('PEXPIRE', KEYS[5 + l[1]], MAX_MS)
    l[2] = MAX_MS
  end
  if l[2] > longest then longest = l[2] end
end
if n > 1 and longest > 0 then cover_limit(KEYS[4], n, longest) end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if free == nil then
  if ARGV[5] ~= '' then
    -- Join (or stay in) the queue of waiters, and say this waiter is alive (and not
    -- woken: a wake-up goes to it again). Each key gets its expiry right after its
    -- write, so a failing later step (a key of the wrong type, written by hand) cannot
    -- leave one without. The first PEXPIRE, before any write, fails for a user denied
    -- it (an ACL short of lockrun's rule) while nothing is written yet; so does the
    -- HDEL, before the HSET of the same hash.
    redis.call('PEXPIRE', KEYS[2], ARGV[6] * 2)
    redis.call('ZADD', KEYS[2], 'NX', now_us, ARGV[5])
    redis.call('PEXPIRE', KEYS[2], ARGV[6] * 2)
    redis.call('HDEL', KEYS[3], 'w:' .. ARGV[5])
    redis.call('HSET', KEYS[3], ARGV[5], string.format('%.0f', math.floor(now_us / 1000) + tonumber(ARGV[6])))
    redis.call('PEXPIRE', KEYS[3], ARGV[6] * 2)
  end
  local slot, pttl = nil, nil
  for _, l in ipairs(live) do
    if (want == nil or want == l[1]) and (pttl == nil or l[2] < pttl) then
      slot, pttl = l[1], l[2]
    end
  end
  local h = redis.call('HMGET', KEYS[5 + slot], 'host', 'pid', 'since_ms', 'fence')
  return answer({0, h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl, slot, n})
end
-- The fencing token never goes below the server clock in microseconds, so it keeps
-- growing after the counter was lost (expired, restart without data, FLUSHALL), and
-- never below the last token + 1. One counter per name, whatever the slot.
local last = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local fence = now_us
if last >= fence then fence = last + 1 end
local fs = string.format('%.0f', fence)
-- Leave the queue first: these only remove, and a failure here writes nothing.
if ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[5])
  redis.call('HDEL', KEYS[3], ARGV[5], 'w:' .. ARGV[5])
end
-- Each write carries its expiry in the same command, or is followed at once by it:
-- the counter is SET with PX, and the slot's hash did not exist (PTTL -2), so neither
-- HSET nor the PEXPIRE with its checked argument can fail in between. Nor can an ACL
-- that denies PEXPIRE make it fail there: the PEXPIRE of the key, which does not
-- exist yet, changes nothing but fails first. A plain lock's hash has exactly the
-- fields it had before semaphores.
local key = KEYS[5 + free]
redis.call('PEXPIRE', key, ARGV[2])
redis.call('SET', KEYS[1], fs, 'PX', FENCE_KEEP_MS)
local since = string.format('%.0f', math.floor(now_us / 1000))
if n == 1 then
  redis.call('HSET', key, 'token', ARGV[1], 'fence', fs, 'host', ARGV[3], 'pid', ARGV[4],
    'since_ms', since)
else
  redis.call('HSET', key, 'token', ARGV[1], 'fence', fs, 'host', ARGV[3], 'pid', ARGV[4],
    'since_ms', since, 'slot', free, 'slots', n)
end
redis.call('PEXPIRE', key, ARGV[2])
if n > 1 then cover_limit(KEYS[4], n, ARGV[2]) end
return answer({1, fs, free, table.concat(free_map)})
