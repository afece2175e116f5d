-- KEYS: the run record. Returns its fields host, pid, fence, slot, started_ms,
-- ended_ms, exit, ended_by (each nil when there is no record).
return redis.call('HMGET', KEYS[1], 'host', 'pid', 'fence', 'slot', 'started_ms', 'ended_ms',
  'exit', 'ended_by')
