-- KEYS: lock, queue, alive. ARGV: token, keep_ms, wake channel prefix.
-- Returns 1 if released (or shortened to keep_ms), 0 if not ours.
local bad = bad_ms('keep_ms', ARGV[2], 0)
if bad then return redis.error_reply(bad) end
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
