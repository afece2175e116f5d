-- KEYS: queue, alive, limit, the run record, the fencing counter, then the N slot keys. ARGV: token,
-- keep_ms, wake channel prefix, give_back ('1': Redlock gives back what an acquisition
-- without a majority took; '' or none: a holder's release), alive_ms (with give_back:
-- the waiter's heartbeat), exit status and why the run ended (both '' or none: no
-- record, an attempt given up). Returns 1 if released (or shortened to keep_ms), 0 if
-- not ours.
-- A holder's release leaves the run's record (record.rs): the holder as stored, the
-- slot, how it ended and when by this server's clock, kept as long as the fencing
-- counter; a run that exited 0 also as the last success (ok_started_ms, ok_host),
-- which any other run's record leaves as it was (--once-per).
-- The token is looked for in every slot, so a release works for an acquire whose
-- answer was lost (and frees every slot it holds, should a Redlock round have left it
-- two). Each slot freed wakes one waiter, or a holder's release grants it to that
-- waiter (grant.lua); the last holder of a semaphore to go takes the limit key with it.
-- A slot given back that a woken waiter took (its `waiter` and `woken` fields, see the
-- acquire script) puts that waiter back at the head of the queue, alive, with the wake
-- mark it had, so the slot stays kept for it until the same grace ends, and wakes no
-- one else while that grace lasts (after it, the next waiter, as for any release).
local bad = bad_ms('keep_ms', ARGV[2], 0)
if bad then return redis.error_reply(bad) end
local give_back = ARGV[4] == '1'
if give_back then
  bad = bad_ms('alive_ms', ARGV[5], 1)
  if bad then return redis.error_reply(bad) end
end
local record = ARGV[6] ~= nil and ARGV[6] ~= ''
if record and not (string.match(ARGV[6], '^%d%d?%d?$') and string.match(ARGV[7] or '', '^[a-z_]+$')) then
  return redis.error_reply('ERR lockrun: the run record needs an exit status and a reason, not ' ..
    tostring(ARGV[6]) .. ' ' .. tostring(ARGV[7]))
end
-- Writes the record of the run that held slot `slot` as `h` (the fields read below).
-- Its expiry is set before the write (a user denied PEXPIRE fails before writing) and
-- right after it.
local function record_run(h, slot)
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('PEXPIRE', KEYS[4], FENCE_KEEP_MS)
  redis.call('HSET', KEYS[4], 'host', h[5] or '', 'pid', h[6] or '0', 'fence', h[8] or '0',
    'slot', slot, 'started_ms', h[7] or '0', 'ended_ms', string.format('%.0f', now_ms),
    'exit', ARGV[6], 'ended_by', ARGV[7])
  if ARGV[6] == '0' then
    redis.call('HSET', KEYS[4], 'ok_started_ms', h[7] or '0', 'ok_host', h[5] or '')
  end
  redis.call('PEXPIRE', KEYS[4], FENCE_KEEP_MS)
end
-- Puts waiter `id`, woken at `mark`, back at the head of the queue; true if its
-- priority lasts (the mark is younger than WAKE_GRACE_MS). As in the acquire
-- script, each key gets its expiry before and right after its write (the queue and
-- the alive hash may be gone: the waiter was the last one), and the first PEXPIRE
-- fails for a user denied it before anything is written.
local function requeue(id, mark)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local score = now_us
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) - 1 < score then score = tonumber(head[2]) - 1 end
  redis.call('PEXPIRE', KEYS[1], ARGV[5] * 2)
  redis.call('ZADD', KEYS[1], 'NX', string.format('%.0f', score), id)
  redis.call('PEXPIRE', KEYS[1], ARGV[5] * 2)
  redis.call('HSET', KEYS[2], id, string.format('%.0f', math.floor(now_us / 1000) + tonumber(ARGV[5])),
    'w:' .. id, mark)
  redis.call('PEXPIRE', KEYS[2], ARGV[5] * 2)
  local age = math.floor(now_us / 1000) - (tonumber(mark) or 0)
  return age >= 0 and age < WAKE_GRACE_MS
end
local found, n = false, nil
local keys = {queue = KEYS[1], alive = KEYS[2], limit = KEYS[3], fence = KEYS[5]}
for i = 6, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'token', 'slots', 'waiter', 'woken', 'host', 'pid',
    'since_ms', 'fence')
  if h[1] == ARGV[1] then
    found, n = true, tonumber(h[2] or '1')
    if record and not give_back then record_run(h, i - 6) end
    if tonumber(ARGV[2]) > 0 then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
      if n and n > 1 then cover_limit(KEYS[3], h[2], ARGV[2]) end
    elseif give_back and h[3] and h[4] then
      local kept = requeue(h[3], h[4])
      redis.call('DEL', KEYS[i])
      if not kept then wake(KEYS[1], KEYS[2], ARGV[3], 1) end
    else
      redis.call('DEL', KEYS[i])
      wake(KEYS[1], KEYS[2], ARGV[3], 1, granter(keys, KEYS[i], i - 6, n or 1, ARGV[3]))
    end
  end
end
if not found then return 0 end
if tonumber(ARGV[2]) == 0 and n and n > 1 and n <= #KEYS - 5 then
  for j = 6, 5 + n do
    if redis.call('EXISTS', KEYS[j]) == 1 then return 1 end
  end
  redis.call('DEL', KEYS[3])
end
return 1
