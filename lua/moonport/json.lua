-- SPDX-License-Identifier: MIT
-- mp.json: lua-cjson's encode and decode, plus arrays that stay arrays when
-- empty. res:json and req:json go through here.
--
-- Debian's lua-cjson 2.1.0 encodes every empty table as {} and has no
-- empty_array_mt, so mp.json.array(t) marks t (a weak set). When a marked
-- table is empty at encode time, it holds a one-string placeholder during
-- the encode, and the placeholder's text becomes [] in the output. The
-- placeholder is a random string made per process, so no data can spell
-- it. With no marked table alive, encode is cjson.encode plus one next().
local cjson = require("cjson")
local cjson_safe = require("cjson.safe")

local next, pcall, type, error, tostring = next, pcall, type, error, tostring
local setmetatable = setmetatable
local cencode, sdecode = cjson.encode, cjson_safe.decode
local random, char, concat = math.random, string.char, table.concat
local find, gsub = string.find, string.gsub

local M = { null = cjson.null }

local marked = setmetatable({}, { __mode = "k" })

local hole, hole_json
local function placeholder()
  local b = {}
  for i = 1, 24 do b[i] = char(random(97, 122)) end
  hole = "\0moonport-empty-array-" .. concat(b)
  hole_json = cencode({ hole }) -- ["\u0000moonport-empty-array-..."]
end

-- mp.json.array([t]): t (or a new table), marked to encode as an array
-- even when empty. Returns it.
function M.array(t)
  if t == nil then t = {} end
  if type(t) ~= "table" then
    error("bad argument #1 to 'array' (table expected, got " .. type(t) .. ")", 2)
  end
  marked[t] = true
  return t
end

function M.is_array(t)
  return marked[t] == true
end

local function encode_marked(v)
  if not hole then placeholder() end
  local filled = {}
  local n = 0
  for t in next, marked do
    if next(t) == nil then
      n = n + 1
      filled[n] = t
      t[1] = hole
    end
  end
  local ok, s = pcall(cencode, v)
  for i = 1, n do
    local t = filled[i]
    t[1] = nil
  end
  if not ok then error(s, 3) end
  if n == 0 then return s end
  -- plain find and rebuild: the placeholder has no pattern characters but
  -- gsub would still need it escaped
  local out, pos, m = {}, 1, 0
  while true do
    local a, b = s:find(hole_json, pos, true)
    if not a then break end
    m = m + 1
    out[m] = s:sub(pos, a - 1)
    m = m + 1
    out[m] = "[]"
    pos = b + 1
  end
  if m == 0 then return s end
  out[m + 1] = s:sub(pos)
  return concat(out)
end

-- cjson writes "/" as "\/" (legal, but URLs in JSON then read badly) and
-- Debian's 2.1.0 has no encode_escape_forward_slash to turn it off. Every
-- "/" is escaped and every backslash opens an escape ("\\", "\n", "\u0000",
-- ...), so a left-to-right replace of "\/" meets only the escaped slashes.
local cjson_escapes_slash = cencode("/") ~= '"/"'
if cjson.encode_escape_forward_slash then
  cjson.encode_escape_forward_slash(false)
  cjson_safe.encode_escape_forward_slash(false)
  cjson_escapes_slash = false
end

local function unslash(s)
  if cjson_escapes_slash and find(s, "\\/", 1, true) then
    return (gsub(s, "\\/", "/"))
  end
  return s
end

-- mp.json.encode(v): the JSON text. Raises for what JSON can't hold
-- (a function, a sparse array, a cycle), as cjson.encode does.
function M.encode(v)
  if next(marked) == nil then return unslash(cencode(v)) end
  return unslash(encode_marked(v))
end

-- mp.json.decode(s): the value, or nil and a message.
function M.decode(s)
  if type(s) ~= "string" then
    return nil, "expected a string, got " .. type(s)
  end
  local v, err = sdecode(s)
  if v == nil and err then return nil, "invalid JSON: " .. tostring(err) end
  return v
end

return M
