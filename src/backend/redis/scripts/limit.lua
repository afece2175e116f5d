-- Prepended to the scripts that set a semaphore holder's lease. The name's limit key
-- (`P{NAME}:slots`) holds the N of `--slots` its live holders were taken with, and
-- lasts at least as long as the longest of their leases: an acquirer with another N,
-- which does not look at the slots beyond its own N, still sees it and is refused. A
-- plain lock (N = 1) never writes it. Written with its expiry in the same command.
local function cover_limit(key, n, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('SET', key, n, 'PX', ms)
  end
end
