-- KEYS: queue, alive. ARGV: waiter_id.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
