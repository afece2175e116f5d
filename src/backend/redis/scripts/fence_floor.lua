-- KEYS: fence, the slot taken. ARGV: fencing token, owner token.
-- Redlock: raise this server's counter to the token the quorum handed out, and record
-- it on our lock entry, so every majority afterwards answers with a larger one. The
-- counter is written with its expiry in the same command (see acquire.lua).
if not string.match(ARGV[1], '^%d+$') or #ARGV[1] > 19 then
  return redis.error_reply('ERR lockrun: the fencing token must be a whole number, not ' .. ARGV[1])
end
local last = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if last < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', FENCE_KEEP_MS)
else
  -- Kept as it is, with a fresh expiry (a counter from an older lockrun has none).
  redis.call('PEXPIRE', KEYS[1], FENCE_KEEP_MS)
end
if redis.call('HGET', KEYS[2], 'token') == ARGV[2] then
  redis.call('HSET', KEYS[2], 'fence', ARGV[1])
end
return 1
