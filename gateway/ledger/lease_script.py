"""The one Lua script per-replica leases run in Redis: its layout of keys, arguments and answer.

Owns the script text and the contract below; ``gateway.ledger.lease`` packs the calls and reads the
answers. Does not own when it runs or what the slices are.
"""

from __future__ import annotations

# One script: first the adjustments (settlements and given-back slices), then the takes. A take asks
# a counter for ``need`` (which must fit, else nothing at all is taken) plus up to ``extra`` (taken as
# far as it fits). KEYS: na rate counts, nb budget hashes (the adjustments), then nr x (this window's
# count, last window's), nt budget hashes (the takes). ARGV: na, nb, nr, nt, weight * 1e6, rate TTL,
# budget TTL, na deltas, nb x (spent delta, reserved delta), nr x (limit, need, extra), nt x (hard or
# -1, need, extra). Returns {status, scope index, nr x (count, last count, granted), nt x (spent,
# reserved, granted)}: status 0 granted (counts after), 1 a rate refused, 2 budget ``index`` refused
# (counts before, nothing granted). Numbers go back to Redis through '%d': Lua would print a large
# one as '1e+16', which INCRBY refuses.
LEASE_SCRIPT = """
local na, nb, nr, nt = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local w = tonumber(ARGV[5]) / 1000000
local a = 8
for i = 1, na do
  redis.call('INCRBY', KEYS[i], ARGV[a])
  redis.call('EXPIRE', KEYS[i], ARGV[6])
  a = a + 1
end
for i = na + 1, na + nb do
  redis.call('HINCRBY', KEYS[i], 'spent', ARGV[a])
  redis.call('HINCRBY', KEYS[i], 'reserved', ARGV[a + 1])
  redis.call('EXPIRE', KEYS[i], ARGV[7])
  a = a + 2
end
local k = na + nb
local out = {0, 0}
local room = {}
for i = 1, nr do
  local cur = tonumber(redis.call('GET', KEYS[k + 2 * i - 1]) or '0')
  local prev = tonumber(redis.call('GET', KEYS[k + 2 * i]) or '0')
  room[i] = tonumber(ARGV[a + 3 * i - 3]) - prev * w - cur
  if tonumber(ARGV[a + 3 * i - 2]) > room[i] then out[1] = 1 end
  out[#out + 1] = cur
  out[#out + 1] = prev
  out[#out + 1] = 0
end
if out[1] ~= 0 then return out end
local b, kb = a + 3 * nr, k + 2 * nr
local broom = {}
for j = 1, nt do
  local v = redis.call('HMGET', KEYS[kb + j], 'spent', 'reserved')
  local spent, reserved = tonumber(v[1] or '0'), tonumber(v[2] or '0')
  local hard = tonumber(ARGV[b + 3 * j - 3])
  broom[j] = hard >= 0 and hard - spent - reserved or math.huge
  if out[1] == 0 and tonumber(ARGV[b + 3 * j - 2]) > broom[j] then
    out[1] = 2
    out[2] = j
  end
  out[#out + 1] = spent
  out[#out + 1] = reserved
  out[#out + 1] = 0
end
if out[1] ~= 0 then return out end
for i = 1, nr do
  local need, extra = tonumber(ARGV[a + 3 * i - 2]), tonumber(ARGV[a + 3 * i - 1])
  local g = need + math.max(0, math.min(extra, math.floor(room[i] - need)))
  if g > 0 then
    redis.call('INCRBY', KEYS[k + 2 * i - 1], string.format('%d', g))
    redis.call('EXPIRE', KEYS[k + 2 * i - 1], ARGV[6])
  end
  out[3 * i] = out[3 * i] + g
  out[3 * i + 2] = g
end
for j = 1, nt do
  local need, extra = tonumber(ARGV[b + 3 * j - 2]), tonumber(ARGV[b + 3 * j - 1])
  local g = need + math.max(0, math.min(extra, math.floor(broom[j] - need)))
  if g > 0 then
    redis.call('HINCRBY', KEYS[kb + j], 'reserved', string.format('%d', g))
    redis.call('EXPIRE', KEYS[kb + j], ARGV[7])
  end
  local o = 3 * nr + 3 * j
  out[o + 1] = out[o + 1] + g
  out[o + 2] = g
end
return out
"""

__all__ = ["LEASE_SCRIPT"]
