"""The Redis store's server-side Lua scripts: one decision each.

Key layout (one tenant; ``T`` is the tenant name as UTF-8 hex, the braces
are a cluster hash tag so that one script's keys share a slot):

===============================  ======  ==========================================
key                              type    TTL
===============================  ======  ==========================================
``<prefix>{T}:rpm``              hash    ``l`` level, ``t`` time of that level:
``<prefix>{T}:tpm``              hash    time to refill to full + 60 s (an expired
                                         bucket reads as full, which it would be)
``<prefix>{T}:day``              hash    ``d`` UTC day, ``u`` tokens charged that
                                         day: until one hour after that day ends
``<prefix>{T}:slots``            zset    concurrency slots scored by lease expiry
                                         (ms, ``lease_ttl_s`` after the reservation
                                         or the last renewal): the latest + 60 s
``<prefix>{T}:holds``            zset    holds with tokens to settle, scored by
                                         lease expiry (ms): the latest lease + 60 s
``<prefix>{T}:void``             zset    voids that arrived before their lost
                                         reservation, scored by lease expiry (ms):
                                         the latest + 60 s; only after a lost call
===============================  ======  ==========================================

Time is the server's (``TIME``), never a replica's. Numbers that must keep
their fraction (levels, times) are written and returned as ``%.17g``
strings: Redis turns a Lua number reply into an integer.

**reserve** (keys rpm, tpm, day, slots, holds, void; argv rpm, tpm, minute
charge, tpd, day charge, max concurrent, hold id, lease ms, register, slot
lease ms) first looks for its hold id in ``void``: a replica gave up on this
very call (its reply was lost) and the void got there first, so it takes
nothing, removes the tombstone and answers refused bit 16 (nobody waits for
that answer). Otherwise it evaluates every limit (expired slots are pruned
first), and only if none fails takes 1 request, the minute charge, the day
charge (a counter of an older day starts again at 0), a slot scored ``now +
slot lease`` (its replica renews it, see **renew**) and, when ``register``
is 1, the hold's entry in ``holds`` scored ``now + lease`` (the longest the
request may run). A 0 limit is unlimited; a 0 charge is not checked.
Returns ``{refused bits, requests level, tokens level, seconds to the next
UTC midnight, day}`` (levels as found on refusal, after the take on
success, ``""`` when unlimited).

**settle** (keys tpm, day, slots, holds, void; argv hold id, tpm, minute
refund, day, day refund, void 0|1, lease ms) applies the token refunds
(negative: charges) only if it removes the hold's entry from ``holds``: a
settlement retried after a lost reply, or arriving after the hold's lease,
changes nothing (the tokens stay charged). The minute's bucket never refills
past its limit; the day counter is adjusted only while it still counts the
hold's day, never below 0. The slot is removed in any case. A *void* (the
settlement of a reservation whose reply was lost) that finds neither the
hold nor its slot may have overtaken that reservation on its way to the
server (another connection): it leaves a tombstone in ``void`` for the
lease, which the reservation finds if it ever runs. Returns ``{refunds
applied 0|1, slot freed 0|1}``.

**renew** (keys slots; argv slot lease ms, then the slot ids one replica
holds for the tenant) scores each id ``now + slot lease``, adding the ones
that are missing, and returns how many it added. A missing id is a slot
that expired while its replica could not reach the server (it renewed only
what it still holds: its requests are running), or one wiped with the
server's data: counting it again is the true state, even if the tenant is
then over its limit for a while (new reservations are refused until it is
not). It never prunes: ``reserve`` does.

**Out of memory.** Every script starts with the ``#!lua`` shebang and no
flags: Redis (7.0+) then knows before running it that it may write, and
while the server is over ``maxmemory`` (``noeviction``, or nothing left to
evict) it refuses the whole script up front with ``OOM`` (redis-py's
``OutOfMemoryError``), before any write. Without the shebang a script is
only refused at its first *deny-oom* write and, once it has written
anything, runs on past ``maxmemory``: ``reserve`` with a concurrency limit
writes first with ``ZREMRANGEBYSCORE`` (not deny-oom), so it admitted while
the same server refused every other tenant, and ``healthy`` (``/readyz``)
flipped with whoever called last. Now a full server is a store failure for
every call (``limits_unavailable`` under ``on_error: closed``), and nothing
is half written. No script declares ``allow-oom`` (nor ``no-writes``: each
one writes).
"""

from __future__ import annotations

#: first line of every script: flags declared (none), so an OOM refusal comes
#: before the script runs (see the module docstring)
SHEBANG = "#!lua\n"

_COMMON = """
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec + usec / 1000000
local now_ms = sec * 1000 + math.floor(usec / 1000)
local function fmt(x) return string.format('%.17g', x) end
local function level(key, limit)
  local v = redis.call('HMGET', key, 'l', 't')
  if not v[1] then return limit end
  local l = tonumber(v[1]) + math.max(0, now - tonumber(v[2])) * limit / 60
  if l > limit then return limit end
  return l
end
local function store(key, limit, l)
  redis.call('HSET', key, 'l', fmt(l), 't', fmt(now))
  redis.call('PEXPIRE', key, math.ceil((limit - l) * 60000 / limit) + 60000)
end
"""

RESERVE = (
    SHEBANG
    + _COMMON
    + """
local rpm, tpm, minute = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tpd, daily, conc = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local hold, lease, register = ARGV[7], tonumber(ARGV[8]), ARGV[9] == '1'
local slot_lease = tonumber(ARGV[10])
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
local day = math.floor(sec / 86400)
local until_midnight = fmt((day + 1) * 86400 - now)
if hold ~= '' then
  local dead = redis.call('ZSCORE', KEYS[6], hold)
  if dead then
    redis.call('ZREM', KEYS[6], hold)
    if tonumber(dead) > now_ms then return {16, '', '', until_midnight, day} end
  end
end
local refused = 0
local rl, tl = nil, nil
if rpm > 0 then
  rl = level(KEYS[1], rpm)
  if rl < 1 then refused = refused + 1 end
end
if tpm > 0 then
  tl = level(KEYS[2], tpm)
  if minute > 0 and tl < minute then refused = refused + 2 end
end
local used = 0
if tpd > 0 then
  local d = redis.call('HMGET', KEYS[3], 'd', 'u')
  if d[1] and tonumber(d[1]) == day then used = tonumber(d[2]) end
  if daily > 0 and used + daily > tpd then refused = refused + 4 end
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[4]) >= conc then refused = refused + 8 end
end
if refused == 0 then
  if rl then
    rl = rl - 1
    store(KEYS[1], rpm, rl)
  end
  if tl then
    tl = tl - minute
    store(KEYS[2], tpm, tl)
  end
  if tpd > 0 then
    redis.call('HSET', KEYS[3], 'd', day, 'u', used + daily)
    redis.call('EXPIREAT', KEYS[3], (day + 1) * 86400 + 3600)
  end
  if conc > 0 then
    redis.call('ZADD', KEYS[4], now_ms + slot_lease, hold)
    extend(KEYS[4], slot_lease + 60000)
  end
  if register then
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now_ms)
    redis.call('ZADD', KEYS[5], now_ms + lease, hold)
    extend(KEYS[5], lease + 60000)
  end
end
local rs, ts = '', ''
if rl then rs = fmt(rl) end
if tl then ts = fmt(tl) end
return {refused, rs, ts, until_midnight, day}
"""
)

SETTLE = (
    SHEBANG
    + _COMMON
    + """
local hold = ARGV[1]
local applied = 0
local held = redis.call('ZREM', KEYS[4], hold)
if held == 1 then
  applied = 1
  local tpm, refund = tonumber(ARGV[2]), tonumber(ARGV[3])
  if tpm > 0 and refund ~= 0 then
    local l = level(KEYS[1], tpm) + refund
    if l > tpm then l = tpm end
    store(KEYS[1], tpm, l)
  end
  local day, back = tonumber(ARGV[4]), tonumber(ARGV[5])
  if back ~= 0 then
    local d = redis.call('HMGET', KEYS[2], 'd', 'u')
    if d[1] and tonumber(d[1]) == day then
      local u = tonumber(d[2]) - back
      if u < 0 then u = 0 end
      redis.call('HSET', KEYS[2], 'u', u)
    end
  end
end
local freed = redis.call('ZREM', KEYS[3], hold)
if ARGV[6] == '1' and held == 0 and freed == 0 then
  local lease = tonumber(ARGV[7])
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now_ms)
  redis.call('ZADD', KEYS[5], now_ms + lease, hold)
  if redis.call('PTTL', KEYS[5]) < lease + 60000 then
    redis.call('PEXPIRE', KEYS[5], lease + 60000)
  end
end
return {applied, freed}
"""
)

RENEW = (
    SHEBANG
    + """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local added = 0
for i = 2, #ARGV do
  added = added + redis.call('ZADD', KEYS[1], expiry, ARGV[i])
end
local keep = tonumber(ARGV[1]) + 60000
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
return added
"""
)

#: the readiness probe: what a reservation needs (scripts run, writes accepted),
#: not just that Redis answers (a read-only replica or a full server answers
#: PING and refuses every reservation). Writes KEYS[1] with a short TTL; like
#: the others, refused up front on a full server.
PROBE = (
    SHEBANG
    + """
redis.call('SET', KEYS[1], '1', 'PX', 60000)
return 1
"""
)
