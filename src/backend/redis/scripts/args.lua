-- Prepended to every script that sets an expiry: its millisecond arguments are checked
-- before the script writes anything, so no step can fail after the first write and
-- leave a key without an expiry (a PEXPIRE refusing its argument would do that).
-- A lease is at most MAX_MS long (24 h, lockrun's largest --ttl); a lock found without
-- an expiry (an older lockrun, or written by hand) is given that much.
local MAX_MS = 86400000
-- How long a fencing counter outlives its last write: see the `FENCE_KEEP` comment in
-- scripts.rs for why tokens still only increase once it is gone.
local FENCE_KEEP_MS = 604800000
-- How long a woken waiter has priority for a free slot: see the acquire script.
local WAKE_GRACE_MS = 2000

-- Nil if `value` is a whole number of milliseconds from `min` to MAX_MS; otherwise
-- the error line. Strict digits: tonumber() would take '1e3', '0x10' or ' 5'.
local function bad_ms(what, value, min)
  if type(value) == 'string' and string.match(value, '^%d+$') and #value <= 9 then
    local n = tonumber(value)
    if n >= min and n <= MAX_MS then return nil end
  end
  return 'ERR lockrun: ' .. what .. ' must be a whole number of milliseconds from ' ..
    min .. ' to ' .. MAX_MS .. ', not ' .. tostring(value)
end
