-- KEYS: lock. Returns {host, pid, since_ms, fence, pttl} of the holder, or {}.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return {} end
if pttl == -1 then
  -- A lock without an expiry (see args.lua) is given the longest lease lockrun takes.
  -- pcall: `status` still answers where the user may not write (an ACL, a replica).
  redis.pcall('PEXPIRE', KEYS[1], MAX_MS)
  pttl = MAX_MS
end
local h = redis.call('HMGET', KEYS[1], 'host', 'pid', 'since_ms', 'fence')
return {h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl}
