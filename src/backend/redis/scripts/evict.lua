-- Prepended to the scripts that take a slot (acquire; release, which grants one): may
-- this server evict a held lock? A server with maxmemory set and a policy other than
-- noeviction (the volatile-* ones too: the lock has an expiry) may drop the lock while
-- it is held, and a second holder gets in. Returns 'evicts', policy, maxmemory when it
-- may; 'unchecked', why when INFO could not be read (an ACL without INFO); nil when it
-- may not. (A field is found by a plain search for its line: a pattern search would
-- cost more than INFO itself.)
local function info_field(info, name)
  local at = string.find(info, '\n' .. name .. ':', 1, true)
  return at and string.match(info, '^[%w_%-]+', at + #name + 2)
end
local function eviction()
  local info = redis.pcall('INFO', 'memory')
  if type(info) ~= 'string' then
    return 'unchecked', tostring(type(info) == 'table' and info.err or info)
  end
  local max = info_field(info, 'maxmemory')
  local policy = info_field(info, 'maxmemory_policy')
  if not (max and string.match(max, '^%d+$') and policy) then
    return 'unchecked', 'INFO memory shows no maxmemory or maxmemory_policy'
  end
  if tonumber(max) ~= 0 and policy ~= 'noeviction' then return 'evicts', policy, max end
  return nil
end
