-- KEYS: limit, then the slot keys to look in (the one taken, or all N).
-- ARGV: token, ttl_ms. Returns 1 if extended, 0 if not ours.
local bad = bad_ms('ttl_ms', ARGV[2], 1)
if bad then return redis.error_reply(bad) end
for i = 2, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'token', 'slots')
  if h[1] == ARGV[1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    local n = tonumber(h[2] or '1')
    if n and n > 1 then cover_limit(KEYS[1], h[2], ARGV[2]) end
    return 1
  end
end
return 0
