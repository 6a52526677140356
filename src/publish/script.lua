-- seatboard state-hash compare-and-set (PROTOCOL section 2).
-- KEYS[1] = state hash (<state-prefix><course>)
-- ARGV[1] = field (section id in decimal)
-- ARGV[2] = snapshot JSON
-- ARGV[3] = the snapshot's version in decimal, or "" when it has none
-- Replaces the field when it is absent, not a JSON object, has no integer
-- version (or Version), or the snapshot's version is greater; an equal or
-- lower version keeps it. A snapshot without a version always replaces.
-- Returns 1 when written, 0 when kept.
local new = tonumber(ARGV[3])
if new then
  local old = redis.call('HGET', KEYS[1], ARGV[1])
  if old then
    local ok, doc = pcall(cjson.decode, old)
    if ok and type(doc) == 'table' then
      local v = doc['version']
      if v == nil then v = doc['Version'] end
      if type(v) == 'number' and v == math.floor(v)
        and v >= -9007199254740992 and v <= 9007199254740992
        and new <= v then
        return 0
      end
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
