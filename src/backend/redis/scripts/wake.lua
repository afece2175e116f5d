-- Prepended to the scripts that free a lock: wake the longest-waiting live waiter,
-- and only it (no thundering herd). Waiters whose heartbeat ran out are dropped.
local function wake_one(queue, alive, prefix)
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _ = 1, 16 do
    local head = redis.call('ZRANGE', queue, 0, 0)
    if #head == 0 then return end
    local until_ms = tonumber(redis.call('HGET', alive, head[1]) or '0') or 0
    if until_ms >= now_ms then
      redis.call('PUBLISH', prefix .. head[1], 'released')
      return
    end
    redis.call('ZREM', queue, head[1])
    redis.call('HDEL', alive, head[1])
  end
end
