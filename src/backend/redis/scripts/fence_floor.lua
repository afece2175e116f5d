-- KEYS: fence, lock. ARGV: fencing token, owner token.
-- Redlock: raise this server's counter to the token the quorum handed out, and record
-- it on our lock entry, so every majority afterwards answers with a larger one.
local last = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if last < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
if redis.call('HGET', KEYS[2], 'token') == ARGV[2] then
  redis.call('HSET', KEYS[2], 'fence', ARGV[1])
end
return 1
