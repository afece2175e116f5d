-- KEYS: queue, alive. ARGV: waiter_id. Forgets the waiter (its woken mark and what a
-- grant needs too).
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1], 'w:' .. ARGV[1], 'g:' .. ARGV[1])
return 1
