-- KEYS: queue, alive, limit, then the N slot keys. ARGV: token, keep_ms, wake channel
-- prefix. Returns 1 if released (or shortened to keep_ms), 0 if not ours.
-- The token is looked for in every slot, so a release works for an acquire whose
-- answer was lost (and frees every slot it holds, should a Redlock round have left it
-- two). Each slot freed wakes one waiter; the last holder of a semaphore to go takes
-- the limit key with it.
local bad = bad_ms('keep_ms', ARGV[2], 0)
if bad then return redis.error_reply(bad) end
local found, n = false, nil
for i = 4, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'token', 'slots')
  if h[1] == ARGV[1] then
    found, n = true, tonumber(h[2] or '1')
    if tonumber(ARGV[2]) > 0 then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
      if n and n > 1 then cover_limit(KEYS[3], h[2], ARGV[2]) end
    else
      redis.call('DEL', KEYS[i])
      wake(KEYS[1], KEYS[2], ARGV[3], 1)
    end
  end
end
if not found then return 0 end
if tonumber(ARGV[2]) == 0 and n and n > 1 and n <= #KEYS - 3 then
  for j = 4, 3 + n do
    if redis.call('EXISTS', KEYS[j]) == 1 then return 1 end
  end
  redis.call('DEL', KEYS[3])
end
return 1
