-- SPDX-License-Identifier: MIT
-- The metatable of mp.http's request tables: the fields made on first use
-- (req.form, req.cookies, req.id, req.conn_uid) and the methods (req:read,
-- req:json, req:parts, req:peer, req:tls).
-- The table itself is built by moonport.http from the parts C pushes.
local core = require("moonport.core")
local json = require("moonport.json")
local cookie = require("moonport.cookie")
local multipart = require("moonport.multipart")
local C = core.http -- filled by lx_http_open (src/lx/lx_http.c)
local peer, tls, unescape, read_now, read_wait, uid =
  C.peer, C.tls, C.unescape, C.read_now, C.read_wait, C.uid
local rawget, rawset, concat = rawget, rawset, table.concat

-- req:read(): the next piece of a streamed body, nil at its end, or
-- nil, err. Waits only when nothing has arrived.
local function read(req)
  local chunk, err = read_now(req)
  if chunk == false then return read_wait(req) end
  return chunk, err
end

-- req:json(): the body decoded as JSON, or nil and a message. A streamed
-- body is read to its end first (max_body bounds it, as for req:read).
local function req_json(req)
  local body = rawget(req, "body")
  if body == nil then
    local parts, n = {}, 0
    while true do
      local chunk, err = read(req)
      if chunk == nil then
        if err then return nil, err end
        break
      end
      n = n + 1
      parts[n] = chunk
    end
    body = concat(parts)
  end
  if body == "" then return nil, "empty body" end
  return json.decode(body)
end

-- Request ids: a sane incoming X-Request-Id (1 to 64 of [A-Za-z0-9._-]),
-- else the lane's random prefix and a count (unique without a look-up).
local ID_OK = "^[%w._-]+$"
local id_prefix, id_count = nil, 0
local function new_id()
  if not id_prefix then
    local f = io.open("/dev/urandom", "rb")
    local b = f and f:read(6)
    if f then f:close() end
    if not b or #b < 6 then b = tostring(os.time() * 1e6 + os.clock() * 1e6) end
    id_prefix = (b:gsub(".", function(c) return string.format("%02x", c:byte()) end)):sub(1, 12)
  end
  id_count = id_count + 1
  return string.format("%s-%x", id_prefix, id_count)
end

local function request_id(req)
  local v = rawget(req, "headers")["x-request-id"]
  if v and #v <= 64 and v:find(ID_OK) then return v end
  return new_id()
end

-- name=value pairs of a query or a urlencoded body; a repeated name keeps
-- its last value
local function parse(s, into)
  for pair in s:gmatch("[^&;]+") do
    local k, v = pair:match("^([^=]*)=?(.*)$")
    if k ~= "" then into[unescape(k)] = unescape(v) end
  end
end

return {
  __index = function(req, k)
    if k == "peer" then return peer end
    if k == "tls" then return tls end
    if k == "read" then return read end
    if k == "json" then return req_json end
    if k == "parts" then return multipart.parts end
    if k == "conn_uid" then
      local u = uid(rawget(req, "conn_id"))
      rawset(req, "conn_uid", u)
      return u
    end
    if k == "id" then
      local id = request_id(req)
      rawset(req, "id", id)
      return id
    end
    if k == "cookies" then
      local c = cookie.parse(rawget(req, "headers").cookie)
      rawset(req, "cookies", c)
      return c
    end
    if k ~= "form" then return nil end
    local f = {}
    parse(rawget(req, "query") or "", f)
    local ct = rawget(req, "headers")["content-type"]
    if ct and ct:lower():find("^%s*application/x%-www%-form%-urlencoded") then
      parse(rawget(req, "body") or "", f)
    elseif ct and rawget(req, "body") then
      multipart.fields(rawget(req, "body"), ct, f) -- fields only, not files
    end
    rawset(req, "form", f)
    return f
  end,
}
