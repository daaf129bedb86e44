"""The Lua scripts of the Redis backend (each runs atomically: Redis never interleaves one).

Every key a script touches starts with the store's prefix, so in a Redis Cluster they all
hash to one slot (``gcs.store.redis_cluster``) and no script is refused as cross-slot.

Fencing seam (issue 21, the hot standby): a leader's lease epoch is checked the way every
other condition is, by :data:`BATCH` *before any write*: a condition "META[lease epoch] ==
my epoch" placed first in ``WriteBatch.conditions`` makes a deposed leader's batch fail as a
whole (``StoreConflict`` naming that key) in the same atomic step as the write.  ``FENCE``
and ``INCREMENT`` take no conditions yet; a lease check there goes before their first
``SET`` / ``INCRBY`` in the same way.
"""

from __future__ import annotations

import functools
import hashlib

__all__ = ["BATCH", "FENCE", "INCREMENT", "MIGRATE_KV_LAYOUT", "sha1"]

# KEYS[1] = write-id marker; KEYS[2..] = table hashes.  ARGV[1] = marker TTL (s), ARGV[2] =
# 1 to record a failed condition in the marker (so the reply is a write that WAIT can wait
# for, and a replay gives the same answer), ARGV[3..5] = number of conditions, puts,
# deletes; then per condition (hash index, field, kind 0 absent / 1 equal / 2 present,
# expected), per put (hash index, field, value), per delete (hash index, field).  Returns 0
# when applied (now or by an earlier attempt), 1 when the write id was fenced by landed()
# (not applied), -i when condition i failed (not applied).
BATCH = """
local done = redis.call('GET', KEYS[1])
if done then
  if done == '1' then return 0 end
  if string.sub(done, 1, 1) == 'c' then return -tonumber(string.sub(done, 2)) end
  return 1
end
local ncond, nput, ndel = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local i = 6
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
return 0
"""

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
INCREMENT = """
local done = redis.call('GET', KEYS[2])
if done then return tonumber(done) end
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], value, 'EX', tonumber(ARGV[2]))
return value
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
