-- KEYS: limit, then the N slot keys. Returns {theirs, holder...}: theirs is the N in the
-- limit key when it is not this N (0 otherwise); each holder of a slot is
-- {host, pid, since_ms, fence, pttl, slot, slots, token}.
local n = #KEYS - 1
local theirs = redis.call('GET', KEYS[1])
local out = {0}
if theirs and tonumber(theirs) ~= n then out[1] = theirs end
for i = 0, n - 1 do
  local key = KEYS[2 + i]
  local pttl = redis.call('PTTL', key)
  if pttl ~= -2 then
    if pttl == -1 then
      -- A lock without an expiry (see args.lua) is given the longest lease lockrun
      -- takes. pcall: `status` still answers where the user may not write (an ACL, a
      -- replica).
      redis.pcall('PEXPIRE', key, MAX_MS)
      pttl = MAX_MS
    end
    local h = redis.call('HMGET', key, 'host', 'pid', 'since_ms', 'fence', 'slots', 'token')
    out[#out + 1] = {h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl, i, h[5] or '1', h[6] or ''}
  end
end
return out
