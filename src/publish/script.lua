-- seatboard state-hash compare-and-set (PROTOCOL section 2).
-- KEYS[1] = state hash (<state-prefix><course>)
-- ARGV[1] = field (section id in decimal)
-- ARGV[2] = snapshot JSON
-- ARGV[3] = the snapshot's version in decimal, or "" when it has none
-- Replaces the field when it is absent, not a JSON object, has no integer
-- version (or Version), or the snapshot's version is greater; an equal or
-- lower version keeps it. A snapshot without a version always replaces.
-- Versions compare exactly, as decimal digits: Lua numbers are doubles, which
-- cannot tell 2^53 from 2^53+1.
-- Returns 1 when written, 0 when kept; an error when ARGV[3] is not an integer.

-- A JSON number's text as (negative, digits without leading zeros) when it is
-- an integer ("17", "-3", "1.5e3", "4611686018427387904"), else nil.
local function integer(text)
  local sign, int, frac, e, exp = string.match(text, '^(%-?)(%d+)%.?(%d*)([eE]?)([%+%-]?%d*)$')
  -- An exponent only after an e, and with digits.
  if not sign or (e == '') ~= (exp == '') or (exp ~= '' and not string.match(exp, '%d')) then
    return nil
  end
  local digits = int .. frac
  local shift = (tonumber(exp) or 0) - #frac
  if shift < 0 then
    local cut = #digits + shift
    if cut < 0 then cut = 0 end
    if string.find(string.sub(digits, cut + 1), '[1-9]') then
      return nil
    end
    digits = string.sub(digits, 1, cut)
  end
  digits = string.gsub(digits, '^0+', '')
  if digits == '' then
    return false, '0'
  end
  if shift > 0 then
    -- Far past any version a snapshot can carry (it is at most 64 KiB long).
    if shift > 70000 then shift = 70000 end
    digits = digits .. string.rep('0', shift)
  end
  return sign == '-', digits
end

-- a > b for two integers as returned by `integer` (digits compared one by
-- one: string `<` follows the locale's collation).
local function greater(aneg, a, bneg, b)
  if aneg ~= bneg then
    return bneg
  end
  local gt
  if #a ~= #b then
    gt = #a > #b
  else
    local i = 1
    while i <= #a and string.byte(a, i) == string.byte(b, i) do
      i = i + 1
    end
    if i > #a then
      return false
    end
    gt = string.byte(a, i) > string.byte(b, i)
  end
  if aneg then
    return not gt
  end
  return gt
end

-- `json` with every number outside a string turned into a string of its
-- text, so decoding it gives every number's exact digits.
local function numbers_as_text(json)
  local out, i = {}, 1
  while true do
    local j = string.find(json, '[\"%-%d]', i)
    if not j then
      out[#out + 1] = string.sub(json, i)
      return table.concat(out)
    end
    out[#out + 1] = string.sub(json, i, j - 1)
    local e
    if string.sub(json, j, j) == '"' then
      e = j
      repeat
        e = string.find(json, '[\"\\]', e + 1)
        if not e then return nil end
        local escape = string.sub(json, e, e) == '\\'
        if escape then e = e + 1 end
      until not escape
      out[#out + 1] = string.sub(json, j, e)
    else
      local _
      _, e = string.find(json, '^%-?[%d%.eE%+%-]*', j)
      out[#out + 1] = '"' .. string.sub(json, j, e) .. '"'
    end
    i = e + 1
  end
end

-- The stored entry's version as `integer` returns it, or nil when it has no
-- integer version (or is not a JSON object).
local function stored_version(old)
  local ok, doc = pcall(cjson.decode, old)
  if not ok or type(doc) ~= 'table' then
    return nil
  end
  local key = 'version'
  if doc[key] == nil then key = 'Version' end
  local v = doc[key]
  if type(v) ~= 'number' or v ~= math.floor(v) then
    return nil
  end
  if v > -9007199254740992 and v < 9007199254740992 then
    return v < 0, string.format('%.0f', math.abs(v))
  end
  -- Past 2^53 the double is not the number written: read its text.
  local text = numbers_as_text(old)
  local ok2, raw = pcall(cjson.decode, text or '')
  if not ok2 or type(raw) ~= 'table' or type(raw[key]) ~= 'string' then
    return nil
  end
  return integer(raw[key])
end

if ARGV[3] ~= '' then
  local neg, new = integer(ARGV[3])
  if neg == nil then
    return redis.error_reply('ERR version is not an integer: ' .. ARGV[3])
  end
  local old = redis.call('HGET', KEYS[1], ARGV[1])
  if old then
    local oneg, ov = stored_version(old)
    if oneg ~= nil and not greater(neg, new, oneg, ov) then
      return 0
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
