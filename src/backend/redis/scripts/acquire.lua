-- KEYS: fence, queue, alive, limit, then the N slot keys, slot 0 (the plain lock's key)
--   first.
-- ARGV: token, ttl_ms, host, pid, waiter_id ('' if not waiting), alive_ms, wanted slot
--   ('' or none: the lowest free one; Redlock asks for one slot in its second round),
--   allow_eviction ('1': --allow-eviction; '' or none: check the server's policy),
--   place (the waiter's place in the queue, microseconds: Redlock gives every server
--   the same one, see below; '' or none: the server's time when it first joins),
--   grants ('1': this waiter takes a slot a release grants it, see grant.lua, and a
--   slot found held with its own token is its grant; '' or none: wake-ups only, as
--   Redlock's waiters have them).
-- Returns {1, fence, slot, free} when acquired (free: one character per slot, '1' where
-- it was free); {0, host, pid, since_ms, fence, pttl, slot, slots} when busy (the holder
-- of the wanted slot, or the one whose lease ends first; when the free slots are kept
-- for woken waiters, see WAKE_GRACE_MS, that holder with a pttl of at most the time
-- until the first of their priorities lapses, or, no slot being held, an unknown holder
-- ('', '0', '0', '0') of the first free slot with that time); {2, theirs} when a live holder
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
-- A server that may evict keys is refused, before anything is written, unless allowed
-- (evict.lua). INFO is read here, in the same round trip; a server that will not let
-- the script read it (an ACL without INFO) is told apart, and the lock is taken.
local unchecked = nil
if ARGV[8] ~= '1' then
  local what, a, b = eviction()
  if what == 'evicts' then return {3, a, b} end
  if what == 'unchecked' then unchecked = a end
end
local function answer(reply)
  if unchecked then return {4, unchecked, reply} end
  return reply
end
-- Every holder must have been taken with this N: two limits for one name would let
-- more in than the smaller one. Checked before anything is written.
local theirs = redis.call('GET', KEYS[4])
if theirs and tonumber(theirs) ~= n then return {2, theirs} end
local grants = ARGV[10] == '1' and ARGV[5] ~= ''
local live, free, free_map, mine = {}, nil, {}, nil
for i = 0, n - 1 do
  local pttl = redis.call('PTTL', KEYS[5 + i])
  if pttl == -2 then
    free_map[i + 1] = '1'
    if free == nil and (want == nil or want == i) then free = i end
  else
    free_map[i + 1] = '0'
    local h = redis.call('HMGET', KEYS[5 + i], 'slots', 'token', 'fence')
    local slots = h[1] or '1'
    if tonumber(slots) ~= n then return {2, slots} end
    if grants and h[2] == ARGV[1] and (want == nil or want == i) then mine = {i, h[3] or '0'} end
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
-- Held with this waiter's own token: a release granted it the slot (grant.lua) and
-- its message was lost or came too late to use. Taken again, as an acquisition: out of
-- the queue, a lease of ttl_ms from now, the fencing token of the grant.
if mine then
  redis.call('ZREM', KEYS[2], ARGV[5])
  redis.call('HDEL', KEYS[3], ARGV[5], 'w:' .. ARGV[5], 'g:' .. ARGV[5])
  redis.call('PEXPIRE', KEYS[5 + mine[1]], ARGV[2])
  if n > 1 then cover_limit(KEYS[4], n, ARGV[2]) end
  return answer({1, mine[2], mine[1], table.concat(free_map)})
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- A woken waiter has priority for the slot(s) freed for it. A release wakes the
-- longest-waiting live waiter(s) not woken yet and marks each (`w:ID` in the alive
-- hash) with the server's time in ms; until that mark is WAKE_GRACE_MS old (args.lua),
-- a free slot is kept for it: a caller that is not such a waiter (a waiter whose poll
-- timer fired in between, or a run without --wait) is told busy when the live waiters
-- other than itself with a recent mark are at least as many as the free slots, and
-- waits (queued, if it is a waiter) as it does behind a holder. A mark of '1' (written
-- by an older lockrun) or one from the future (a clock stepped back) gives no
-- priority.
-- Why a grace, not strict first-come-first-served order here: under Redlock each
-- server keeps its own queue. A Redlock waiter gives every server the same place
-- (ARGV[9]), so the queues agree on the waiters they all have; but one that has reached
-- some servers and not yet the others is ahead of another waiter on some and not on
-- all, so each server may keep the slot for another waiter and none of them gets a
-- majority; strict order would then never end (a livelock), while with the grace the
-- worst case is a delay of WAKE_GRACE_MS, after which the slot goes to whoever asks,
-- as before. (Before the shared place, each server queued by its own time of arrival,
-- and waiters that came within a few milliseconds of each other, as a busy lock's
-- do, were in a different order on each server: that split happened every few
-- hand-offs and cost a grace each time.) (A Redlock give-back puts a woken waiter back
-- with the mark it had, never a new one: see the release script.) 2 s is far longer
-- than a woken waiter takes to ask (a pub/sub message and one acquire: milliseconds,
-- tens on a loaded machine), and short enough that a woken waiter that died or froze
-- costs the others little: no more than the 2 s poll they may be in anyway. A mark
-- also goes when its waiter tries again (acquired or busy), leaves the queue, or its
-- heartbeat ends (only live waiters count). Redlock's second round (a `wanted` slot)
-- is not held back: it moves a slot this caller took here a moment ago, in its first
-- round, which this check let pass.
-- Reads only (HGET, ZRANGE, HMGET: in lockrun's ACL rule already), before the writes
-- of either path below, so their order and expiries are as before. The woken waiters
-- are at the front of the queue (a release wakes from the front), so its first N + 64
-- are looked at, whatever its length.
local now_ms = math.floor(now_us / 1000)
-- How long the priority of a waiter woken at `mark` has left, or nil if none.
local function priority_left(mark)
  local at = tonumber(mark or '')
  if at == nil then return nil end
  local age = now_ms - at
  if age >= 0 and age < WAKE_GRACE_MS then return WAKE_GRACE_MS - age end
  return nil
end
-- The caller's own wake mark, when it is a waiter woken within the grace.
local my_mark = nil
if ARGV[5] ~= '' and free ~= nil then
  local mark = redis.call('HGET', KEYS[3], 'w:' .. ARGV[5])
  if priority_left(mark) then my_mark = mark end
end
local reserved_ms = nil
if free ~= nil and want == nil then
  if not my_mark then
    local fields = {}
    for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, n + 63)) do
      if id ~= ARGV[5] then
        fields[#fields + 1] = id
        fields[#fields + 1] = 'w:' .. id
      end
    end
    if #fields > 0 then
      local v = redis.call('HMGET', KEYS[3], unpack(fields))
      local kept, soonest = 0, nil
      for j = 1, #fields, 2 do
        local left = priority_left(v[j + 1])
        if left and (tonumber(v[j] or '0') or 0) >= now_ms then
          kept = kept + 1
          if soonest == nil or left < soonest then soonest = left end
        end
      end
      local free_count = 0
      for _, f in ipairs(free_map) do
        if f == '1' then free_count = free_count + 1 end
      end
      if kept >= free_count then reserved_ms = soonest end
    end
  end
end
if free == nil or reserved_ms then
  if ARGV[5] ~= '' then
    -- Join (or stay in) the queue of waiters, and say this waiter is alive (and not
    -- woken: a wake-up goes to it again). Each key gets its expiry right after its
    -- write, so a failing later step (a key of the wrong type, written by hand) cannot
    -- leave one without. The first PEXPIRE, before any write, fails for a user denied
    -- it (an ACL short of lockrun's rule) while nothing is written yet; so does the
    -- HDEL, before the HSET of the same hash.
    local place = string.format('%.0f', now_us)
    local given = ARGV[9] or ''
    if string.match(given, '^%d+$') and #given <= 16 then place = given end
    redis.call('PEXPIRE', KEYS[2], ARGV[6] * 2)
    redis.call('ZADD', KEYS[2], 'NX', place, ARGV[5])
    redis.call('PEXPIRE', KEYS[2], ARGV[6] * 2)
    redis.call('HDEL', KEYS[3], 'w:' .. ARGV[5])
    redis.call('HSET', KEYS[3], ARGV[5], string.format('%.0f', math.floor(now_us / 1000) + tonumber(ARGV[6])))
    redis.call('PEXPIRE', KEYS[3], ARGV[6] * 2)
    -- What a release needs to grant this waiter a slot (grant.lua): its lease, its
    -- heartbeat, who it is, whether it allows eviction, its N and its token.
    if grants then
      redis.call('HSET', KEYS[3], 'g:' .. ARGV[5], table.concat({ARGV[2], ARGV[6],
        ARGV[4], ARGV[8] == '1' and '1' or '0', n, ARGV[1], ARGV[3]}, ' '))
    else
      redis.call('HDEL', KEYS[3], 'g:' .. ARGV[5])
    end
    redis.call('PEXPIRE', KEYS[3], ARGV[6] * 2)
  end
  local slot, pttl = nil, nil
  for _, l in ipairs(live) do
    if (want == nil or want == l[1]) and (pttl == nil or l[2] < pttl) then
      slot, pttl = l[1], l[2]
    end
  end
  if reserved_ms then
    -- Kept for a woken waiter: ask again when its priority lapses, if not woken before.
    if slot == nil then
      return answer({0, '', '0', '0', '0', reserved_ms, free, n})
    end
    if reserved_ms < pttl then pttl = reserved_ms end
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
  redis.call('HDEL', KEYS[3], ARGV[5], 'w:' .. ARGV[5], 'g:' .. ARGV[5])
end
-- Each write carries its expiry in the same command, or is followed at once by it:
-- the counter is SET with PX, and the slot's hash did not exist (PTTL -2), so neither
-- HSET nor the PEXPIRE with its checked argument can fail in between. Nor can an ACL
-- that denies PEXPIRE make it fail there: the PEXPIRE of the key, which does not
-- exist yet, changes nothing but fails first. A plain lock's hash has exactly the
-- fields it had before semaphores (taken by a woken waiter, two more: see below).
-- A woken waiter that takes the slot records who it is and when it was woken (fields
-- `waiter` and `woken`): should Redlock give the slot back at once (no majority), the
-- release script puts it back at the head of the queue with that same mark, so that
-- it keeps its priority (until the same grace ends: no livelock) and its give-back
-- does not wake the next waiter for the slot.
local key = KEYS[5 + free]
redis.call('PEXPIRE', key, ARGV[2])
redis.call('SET', KEYS[1], fs, 'PX', FENCE_KEEP_MS)
local since = string.format('%.0f', math.floor(now_us / 1000))
local fields = {'token', ARGV[1], 'fence', fs, 'host', ARGV[3], 'pid', ARGV[4],
  'since_ms', since}
if n > 1 then
  for _, f in ipairs({'slot', free, 'slots', n}) do fields[#fields + 1] = f end
end
if my_mark then
  for _, f in ipairs({'waiter', ARGV[5], 'woken', my_mark}) do fields[#fields + 1] = f end
end
redis.call('HSET', key, unpack(fields))
redis.call('PEXPIRE', key, ARGV[2])
if n > 1 then cover_limit(KEYS[4], n, ARGV[2]) end
return answer({1, fs, free, table.concat(free_map)})
