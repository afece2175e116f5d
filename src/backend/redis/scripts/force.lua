-- KEYS: lock, queue, alive. ARGV: wake channel prefix.
-- Deletes the lock whoever holds it and wakes one waiter. Returns what --@inspect
-- returns, about the holder it removed.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return {} end
local h = redis.call('HMGET', KEYS[1], 'host', 'pid', 'since_ms', 'fence')
redis.call('DEL', KEYS[1])
wake_one(KEYS[2], KEYS[3], ARGV[1])
return {h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl}
