-- Prepended to the scripts that free a slot: wake the `count` longest-waiting live
-- waiters not woken yet, and only them (no thundering herd: one per slot freed). A
-- woken waiter is marked (`w:ID` in the alive hash) until it tries again, so that a
-- second slot freed meanwhile wakes the next one, not the same one again; the mark is
-- the server's time in ms, from which the acquire script gives the woken waiter
-- priority for a free slot for a short grace (an older lockrun wrote '1': no priority).
-- Waiters whose heartbeat ran out are dropped. `grant` (the release script's, see
-- grant.lua; nil: wake only) may give the freed slot to the waiter instead of waking
-- it; the waiter granted the slot counts as woken.
local function wake(queue, alive, prefix, count, grant)
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local dropped = 0
  for _, id in ipairs(redis.call('ZRANGE', queue, 0, count + 31)) do
    local until_ms = tonumber(redis.call('HGET', alive, id) or '0') or 0
    if until_ms < now_ms then
      redis.call('ZREM', queue, id)
      redis.call('HDEL', alive, id, 'w:' .. id, 'g:' .. id)
      dropped = dropped + 1
      if dropped >= 16 then return end
    elseif redis.call('HEXISTS', alive, 'w:' .. id) == 0 then
      if not (grant and grant(id, until_ms, now_ms)) then
        redis.call('PUBLISH', prefix .. id, 'released')
        redis.call('HSET', alive, 'w:' .. id, string.format('%.0f', now_ms))
      end
      count = count - 1
      if count == 0 then return end
    end
  end
end
