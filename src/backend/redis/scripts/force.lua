-- KEYS: queue, alive, limit, then the N slot keys. ARGV: wake channel prefix.
-- Deletes every slot whoever holds it and wakes one waiter per slot freed. Returns
-- {0, holder...}, each holder as --@inspect gives it; or {theirs} when a live holder was
-- taken with another --slots (theirs), and then nothing was deleted.
local n = #KEYS - 3
local theirs = redis.call('GET', KEYS[3])
if theirs and tonumber(theirs) ~= n then return {theirs} end
local out = {0}
for i = 0, n - 1 do
  local pttl = redis.call('PTTL', KEYS[4 + i])
  if pttl ~= -2 then
    local h = redis.call('HMGET', KEYS[4 + i], 'host', 'pid', 'since_ms', 'fence', 'slots', 'token')
    local slots = h[5] or '1'
    if tonumber(slots) ~= n then return {slots} end
    out[#out + 1] = {h[1] or '', h[2] or '0', h[3] or '0', h[4] or '0', pttl, i, slots, h[6] or ''}
  end
end
for i = 2, #out do
  redis.call('DEL', KEYS[4 + out[i][6]])
end
if #out > 1 then wake(KEYS[1], KEYS[2], ARGV[1], #out - 1) end
redis.call('DEL', KEYS[3])
return out
