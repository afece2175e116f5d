-- KEYS: the run record. Returns its fields host, pid, fence, slot, started_ms,
-- ended_ms, exit, ended_by (each nil when there is no record), then ok_started_ms and
-- ok_host, the last success (nil when no run of it succeeded).
return redis.call('HMGET', KEYS[1], 'host', 'pid', 'fence', 'slot', 'started_ms', 'ended_ms',
  'exit', 'ended_by', 'ok_started_ms', 'ok_host')
