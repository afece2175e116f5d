-- KEYS: lock. Returns {host, pid, since_ms, fence, pttl} of the holder, or {}.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return {} end
local h = redis.call('HMGET', KEYS[1], 'host', 'pid', 'since_ms', 'fence')
return {h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl}
