-- KEYS: lock. ARGV: token, ttl_ms. Returns 1 if extended, 0 if not ours.
local bad = bad_ms('ttl_ms', ARGV[2], 1)
if bad then return redis.error_reply(bad) end
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
