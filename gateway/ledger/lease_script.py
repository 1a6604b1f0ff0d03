"""The one Lua script per-replica leases run in Redis: its layout of keys, arguments and answer.

Owns the script text and the contract below, and the holders' layout: each replica's share of a
budget hash's ``reserved`` (its unused slices and the reservations of its requests in flight) is a
field ``h:<replica id>`` = ``"<held>:<expires at, ms of Redis's clock>"`` of that same hash (so it
lives and expires with it). ``gateway.ledger.lease`` packs the calls and reads the answers. Does not
own when it runs or what the slices are.
"""

from __future__ import annotations

# Lua: give back what every holder of budget hash ``key`` whose lease ran out (at ``now``, ms) held.
# ``budget.RedisCounters.state`` runs it too, so the status recovers even when no replica asks.
RECLAIM = """
local function reclaim(key, now)
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'h:' then
      local held, exp = string.match(all[i + 1], '^(%d+):(%d+)$')
      if tonumber(exp) < now then
        redis.call('HINCRBY', key, 'reserved', string.format('%d', -tonumber(held)))
        redis.call('HDEL', key, all[i])
      end
    end
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# One script: first the adjustments (settlements and given-back slices), then the takes. A take asks
# a counter for ``need`` (which must fit, else nothing at all is taken) plus up to ``extra`` (taken as
# far as it fits). KEYS: na rate counts, nb budget hashes (the adjustments), then nr x (this window's
# count, last window's), nt budget hashes (the takes). ARGV: na, nb, nr, nt, weight * 1e6, rate TTL,
# budget TTL, replica id, lease TTL (ms), na deltas, nb x (spent delta, reserved delta), nr x (limit,
# need, extra), nt x (hard or -1, need, extra). Returns {status, scope index, nr x (count, last count,
# granted), nt x (spent, reserved, granted)}: status 0 granted (counts after), 1 a rate refused, 2
# budget ``index`` refused (counts before, nothing granted). Every budget hash touched first gives
# back what expired holders held; a reserved delta or a grant moves this replica's holder entry and
# ``reserved`` together and renews the entry, and a holder never goes below 0 (after its entry was
# reclaimed, giving back what it held there changes nothing). Numbers go back to Redis through '%d':
# Lua would print a large one as '1e+16', which INCRBY refuses.
LEASE_SCRIPT = (
    RECLAIM
    + """
local na, nb, nr, nt = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local w = tonumber(ARGV[5]) / 1000000
local me, ttl = 'h:' .. ARGV[8], tonumber(ARGV[9])
local function hold(key, delta)
  local cur = redis.call('HGET', key, me)
  local held = cur and tonumber(string.match(cur, '^(%d+)')) or 0
  local new = math.max(0, held + delta)
  if new ~= held then redis.call('HINCRBY', key, 'reserved', string.format('%d', new - held)) end
  if new > 0 then
    redis.call('HSET', key, me, string.format('%d:%d', new, now + ttl))
  elseif cur then
    redis.call('HDEL', key, me)
  end
end
local a = 10
for i = 1, na do
  redis.call('INCRBY', KEYS[i], ARGV[a])
  redis.call('EXPIRE', KEYS[i], ARGV[6])
  a = a + 1
end
for i = na + 1, na + nb do
  reclaim(KEYS[i], now)
  redis.call('HINCRBY', KEYS[i], 'spent', ARGV[a])
  hold(KEYS[i], tonumber(ARGV[a + 1]))
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
  reclaim(KEYS[kb + j], now)
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
    hold(KEYS[kb + j], g)
    redis.call('EXPIRE', KEYS[kb + j], ARGV[7])
  end
  local o = 3 * nr + 3 * j
  out[o + 1] = out[o + 1] + g
  out[o + 2] = g
end
return out
"""
)

__all__ = ["LEASE_SCRIPT", "RECLAIM"]
