"""The Lua scripts of the Redis backend (each runs atomically: Redis never interleaves one).

Every key a script touches starts with the store's prefix, so in a Redis Cluster they all
hash to one slot (``gcs.store.redis.cluster``) and no script is refused as cross-slot.

High availability (``RedisStore(ha=True)``, ``gcs serve --ha``; ``gcs.store.ha``): the
namespace's HA state is one hash ``__gcs_ha`` (``epoch``: the last lease epoch granted,
never expiring; ``holder``: who it was granted to; ``seq``: the number of the last batch in
the change stream) and a string ``__gcs_lease`` (the live lease's epoch, ``PX`` = TTL on
Redis's clock: it exists exactly while the lease is live).  :data:`BATCH_HA` and
:data:`INCREMENT_HA` are :data:`BATCH` and :data:`INCREMENT` plus, in the same atomic step,

* the fence, after the write-id marker (a retry of a batch that landed still says so) and
  before anything else: a store fenced at epoch ``e`` is refused with the error reply
  ``GCSFENCED <current>`` once ``__gcs_ha.epoch > e``, nothing written;
* the change stream: an applied batch bumps ``seq`` and appends one entry with that number
  as its ID (``<seq>-0``) and one field ``b`` = the batch's changes
  (``gcs.store.ha_parts`` encoding), ``XADD ... MAXLEN ~``.

The ordinary scripts stay exactly as they were: a store without ``ha`` pays nothing.  The
write-id scripts (``FENCE``, behind ``landed()``) are not fenced: they write no data, and a
deposed leader must still learn whether its last batch landed.
"""

from __future__ import annotations

import functools
import hashlib

__all__ = [
    "ACQUIRE_LEASE",
    "BATCH",
    "BATCH_HA",
    "FENCE",
    "FENCED",
    "INCREMENT",
    "INCREMENT_HA",
    "MIGRATE_KV_LAYOUT",
    "READ_CHANGES",
    "READ_LEASE",
    "RELEASE_LEASE",
    "RENEW_LEASE",
    "sha1",
]

FENCED = "GCSFENCED"
"""Error reply code of a fenced write: ``GCSFENCED <current epoch>``; nothing was written."""

# KEYS[1] = write-id marker; KEYS[2..] = table hashes.  ARGV[1] = marker TTL (s), ARGV[2] =
# 1 to record a failed condition in the marker (so the reply is a write that WAIT can wait
# for, and a replay gives the same answer), ARGV[3..5] = number of conditions, puts,
# deletes; then per condition (hash index, field, kind 0 absent / 1 equal / 2 present,
# expected), per put (hash index, field, value), per delete (hash index, field).  Returns 0
# when applied (now or by an earlier attempt), 1 when the write id was fenced by landed()
# (not applied), -i when condition i failed (not applied).
_BATCH = """
local done = redis.call('GET', KEYS[1])
if done then
  if done == '1' then return 0 end
  if string.sub(done, 1, 1) == 'c' then return -tonumber(string.sub(done, 2)) end
  return 1
end
--[[fence]]
local ncond, nput, ndel = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local i = --[[first]]
for c = 1, ncond do
  local current = redis.call('HGET', KEYS[tonumber(ARGV[i])], ARGV[i + 1])
  local kind = ARGV[i + 2]
  local failed = false
  if kind == '0' then
    failed = current ~= false
  elseif kind == '2' then
    failed = current == false
  else
    failed = current ~= ARGV[i + 3]
  end
  if failed then
    if ARGV[2] == '1' then
      redis.call('SET', KEYS[1], 'c' .. c, 'EX', tonumber(ARGV[1]))
    end
    return -c
  end
  i = i + 4
end
for p = 1, nput do
  redis.call('HSET', KEYS[tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
for d = 1, ndel do
  redis.call('HDEL', KEYS[tonumber(ARGV[i])], ARGV[i + 1])
  i = i + 2
end
redis.call('SET', KEYS[1], '1', 'EX', tonumber(ARGV[1]))
--[[append]]
return 0
"""

# The fence: KEYS[{ha}] = HA hash, ARGV[{fence}] = the store's epoch ('0': not fenced).
_FENCE_CHECK = """
if ARGV[{fence}] ~= '0' then
  local current = tonumber(redis.call('HGET', KEYS[{ha}], 'epoch') or '0')
  if current > tonumber(ARGV[{fence}]) then
    return redis.error_reply('GCSFENCED ' .. string.format('%d', current))
  end
end
"""

# One stream entry: KEYS[{stream}] = the stream, ARGV[{maxlen}] = its bound, `blob` = the
# encoded changes.
_APPEND = """
local seq = redis.call('HINCRBY', KEYS[{ha}], 'seq', 1)
redis.call('XADD', KEYS[{stream}], 'MAXLEN', '~', ARGV[{maxlen}], string.format('%d-0', seq),
  'b', {blob})
"""


def _ha_parts(ha: int, stream: int, fence: int, maxlen: int, blob: str) -> tuple[str, str]:
    """The fence check and the stream append, for the key / argument positions given."""
    check = _FENCE_CHECK.replace("{ha}", str(ha)).replace("{fence}", str(fence))
    append = (
        _APPEND.replace("{ha}", str(ha))
        .replace("{stream}", str(stream))
        .replace("{maxlen}", str(maxlen))
        .replace("{blob}", blob)
    )
    return check, append


BATCH = (
    _BATCH.replace("--[[fence]]\n", "").replace("--[[first]]", "6").replace("--[[append]]\n", "")
)

# BATCH with HA: KEYS[1] = marker, KEYS[2] = HA hash, KEYS[3] = change stream, KEYS[4..] =
# table hashes; ARGV[6] = fence epoch ('0': none), ARGV[7] = stream bound, ARGV[8] = the
# batch's changes (encoded), then as in BATCH from ARGV[9].  A fenced store's batch gets the
# error reply GCSFENCED; an applied batch with puts or deletes appends one stream entry.
_check, _append = _ha_parts(ha=2, stream=3, fence=6, maxlen=7, blob="ARGV[8]")
BATCH_HA = (
    _BATCH.replace("--[[fence]]\n", _check.lstrip("\n"))
    .replace("--[[first]]", "9")
    .replace("--[[append]]\n", "if nput + ndel > 0 then" + _append + "end\n")
)

# KEYS[1] = write-id marker; ARGV[1] = fence TTL (s).  1: the batch landed; 0: it did not
# and now never will (a missing marker is set to '0', which the batch script refuses).
FENCE = """
local done = redis.call('GET', KEYS[1])
if done then
  if done == '1' then return 1 end
  return 0
end
redis.call('SET', KEYS[1], '0', 'EX', tonumber(ARGV[1]))
return 0
"""

# KEYS[1] = counter, KEYS[2] = op marker; ARGV[1] = increment, ARGV[2] = marker TTL (s).
_INCREMENT = """
local done = redis.call('GET', KEYS[2])
if done then return tonumber(done) end
--[[fence]]
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], value, 'EX', tonumber(ARGV[2]))
--[[append]]
return value
"""
INCREMENT = _INCREMENT.replace("--[[fence]]\n", "").replace("--[[append]]\n", "")

# INCREMENT with HA: KEYS[3] = HA hash, KEYS[4] = change stream; ARGV[3] = fence epoch,
# ARGV[4] = stream bound, ARGV[5] = the counter's name.  The stream entry is a put of the
# new value (decimal) in table "" (the ha_parts encoding, built here).
_check, _append = _ha_parts(
    ha=3,
    stream=4,
    fence=3,
    maxlen=4,
    blob="struct.pack('>BHI4', 0, 0, #ARGV[5]) .. ARGV[5] .. struct.pack('>I4', #v) .. v",
)
INCREMENT_HA = _INCREMENT.replace("--[[fence]]\n", _check.lstrip("\n")).replace(
    "--[[append]]\n", "local v = string.format('%d', value)" + _append
)

# KEYS[1] = HA hash, KEYS[2] = lease; ARGV[1] = holder, ARGV[2] = TTL (ms).  The new epoch,
# or 0 while another holder's lease is live.
ACQUIRE_LEASE = """
if redis.call('EXISTS', KEYS[2]) == 1 and redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] then
  return 0
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'holder', ARGV[1])
redis.call('SET', KEYS[2], epoch, 'PX', ARGV[2])
return epoch
"""

# KEYS as ACQUIRE_LEASE; ARGV[1] = holder, ARGV[2] = epoch, ARGV[3] = TTL (ms), ARGV[4] =
# the least time (ms) the lease must have left (0: none).  1 when (holder, epoch) is still
# the last grant (live, or lapsed with nobody taking it since) with that much left, and the
# lease now runs TTL from now; 0 otherwise.
RENEW_LEASE = """
local cur = redis.call('HMGET', KEYS[1], 'epoch', 'holder')
if cur[1] ~= ARGV[2] or cur[2] ~= ARGV[1] then return 0 end
local least = tonumber(ARGV[4] or '0')
if least > 0 and redis.call('PTTL', KEYS[2]) < least then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS as ACQUIRE_LEASE; ARGV[1] = holder, ARGV[2] = epoch.  Ends the lease if it is theirs.
RELEASE_LEASE = """
local cur = redis.call('HMGET', KEYS[1], 'epoch', 'holder')
if cur[1] ~= ARGV[2] or cur[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
return 1
"""

# KEYS as ACQUIRE_LEASE.  {epoch, holder, remaining ms}, or nil when no lease is live.
READ_LEASE = """
local ttl = redis.call('PTTL', KEYS[2])
if ttl < 0 then return false end
local cur = redis.call('HMGET', KEYS[1], 'epoch', 'holder')
return {cur[1], cur[2], ttl}
"""

# KEYS[1] = HA hash, KEYS[2] = change stream; ARGV[1] = '(<after>-0', ARGV[2] = count.
# {number of the last batch, entries after the cursor}, read in one atomic step so a gap
# between the two (trimming) is visible.
READ_CHANGES = """
local last = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
return {last, redis.call('XRANGE', KEYS[2], ARGV[1], '+', 'COUNT', ARGV[2])}
"""

# KEYS[1] = KV hash, KEYS[2] = META hash; ARGV[1] = layout version, ARGV[2..] = pairs of
# (KV field, META field) to copy when the META field is absent.  Rewrites old-layout KV
# fields (see gcs/managers/kv.py) once; returns the number of fields rewritten.
MIGRATE_KV_LAYOUT = """
if redis.call('HGET', KEYS[2], '__kv_layout') == ARGV[1] then return 0 end
local all = redis.call('HGETALL', KEYS[1])
local moves = {}
for i = 1, #all, 2 do
  local k = all[i]
  local target = nil
  local colon = nil
  if string.sub(k, 1, 11) == '@namespace_' then colon = string.find(k, ':', 12, true) end
  if colon and colon > 12 then
    local ns = string.sub(k, 12, colon - 1)
    if string.find(ns, '%', 1, true) then
      target = '@namespace_' .. (string.gsub(ns, '%%', '%%25')) .. string.sub(k, colon)
    end
  else
    target = '@namespace_:' .. k
  end
  if target then moves[#moves + 1] = {k, target, all[i + 1]} end
end
for _, m in ipairs(moves) do redis.call('HDEL', KEYS[1], m[1]) end
for _, m in ipairs(moves) do redis.call('HSET', KEYS[1], m[2], m[3]) end
for j = 2, #ARGV, 2 do
  local value = redis.call('HGET', KEYS[1], ARGV[j])
  if value and redis.call('HEXISTS', KEYS[2], ARGV[j + 1]) == 0 then
    redis.call('HSET', KEYS[2], ARGV[j + 1], value)
  end
end
redis.call('HSET', KEYS[2], '__kv_layout', ARGV[1])
return #moves
"""


@functools.cache
def sha1(script: str) -> str:
    """The name Redis gives ``script`` (``EVALSHA``)."""
    return hashlib.sha1(script.encode()).hexdigest()
