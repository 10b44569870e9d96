-- SPDX-License-Identifier: MIT
-- multipart/form-data for mp.http: req:parts() (lua/moonport/request.lua
-- gives it), a streaming walk over a body's parts, and `fields`, the small
-- bodies' fields for req.form. The parser is C (src/http/multipart.c via
-- core.multipart); this file feeds it the body (req:read()'s pieces with
-- stream_body, else req.body) and makes the part objects.
--
-- A bad body or a limit passed raises an HTTP error ({ http_status = 400
-- or 413, message = ... }): the handler's runner answers with that status
-- (lua/moonport/http.lua) unless the handler catches it. part:read,
-- part:body and part:save return nil, err instead, and the next step of
-- the loop raises.
local core = require("moonport.core")
local type, error, tostring, setmetatable, rawget, pairs = type, error, tostring, setmetatable, rawget, pairs
local concat, lower, sub, find = table.concat, string.lower, string.sub, string.find
local io_open, os_remove, collect = io.open, os.remove, collectgarbage
local save_now, read_wait = core.http.save_now, core.http.read_wait

local M = {}

local DEFAULTS = { max_parts = 100, max_header = 8192, max_part = 2 ^ 53 }

local HTTP_ERR = {}
HTTP_ERR.__index = HTTP_ERR
HTTP_ERR.__tostring = function(e) return e.message end

-- an error the runner answers with its status (not a 500)
function M.http_error(status, message)
  return setmetatable({ http_status = status, message = message }, HTTP_ERR)
end

-- The boundary of a multipart/form-data Content-Type, or nil.
function M.boundary(ct)
  if type(ct) ~= "string" or not find(lower(ct), "^%s*multipart/form%-data%s*;") then return nil end
  local b = ct:match('[; ]boundary="([^"]+)"') or ct:match("[; ]boundary=([^;%s]+)")
  return b
end

-- name="value"; name=value parameters of a header value (quoted strings
-- with \-escapes; browsers %-encode '"' and CR LF in names)
local function params(v)
  local out, pos, n = {}, 1, #v
  while pos <= n do
    local s, e, key = find(v, "^[;%s]*([%w!#$%%&'*+%-.^_`|~]+)%s*=%s*", pos)
    if not s then
      local semi = find(v, ";", pos, true)
      if not semi then break end
      pos = semi + 1
    else
      pos = e + 1
      local val
      if sub(v, pos, pos) == '"' then
        local buf, i = {}, pos + 1
        while i <= n do
          local c = sub(v, i, i)
          if c == "\\" and i < n then
            buf[#buf + 1] = sub(v, i + 1, i + 1)
            i = i + 2
          elseif c == '"' then
            break
          else
            buf[#buf + 1] = c
            i = i + 1
          end
        end
        val, pos = concat(buf), i + 1
      else
        local semi = find(v, ";", pos, true) or n + 1
        val, pos = v:sub(pos, semi - 1):match("^(.-)%s*$"), semi + 1
      end
      key = lower(key)
      if out[key] == nil then out[key] = val end
    end
  end
  return out
end

local function parse_headers(block)
  local h = {}
  for line in block:gmatch("([^\r\n]*)\r\n") do
    local k, v = line:match("^([^:%s]+)%s*:%s*(.-)%s*$")
    if k then
      k = lower(k)
      h[k] = h[k] and (h[k] .. ", " .. v) or v
    end
  end
  return h
end

-- ---- the walk ----

-- The body's pieces: req.body whole, or req:read()'s.
local function source(req)
  local body = rawget(req, "body")
  if body ~= nil then
    local given = false
    return function()
      if given then return nil end
      given = true
      return body
    end
  end
  return function() return req:read() end
end

local function fail(st, msg, status)
  st.err = M.http_error(status or 400, "multipart: " .. tostring(msg))
  return nil
end

-- The next event: kind, value; nil when the walk failed (st.err).
local function step(st)
  while true do
    if st.err then return nil end
    if not st.chunk then
      local c, err = st.src()
      if c == nil then
        if err then return fail(st, err, err == "too large" and 413 or 400) end
        local ok, e, status = st.p:finish()
        if not ok then return fail(st, e, status) end
        return "eof"
      end
      st.chunk, st.off = c, 0
    end
    local kind, v, off = st.p:next(st.chunk, st.off)
    if kind == nil then return fail(st, v, off) end
    if kind == "more" then
      st.chunk = nil
    else
      st.off = off
      return kind, v
    end
  end
end

local Part = {}
Part.__index = Part

-- part:read([n]): the next piece of the part's data (at most n bytes),
-- nil at its end, or nil and a message.
function Part:read(n)
  if n ~= nil and (type(n) ~= "number" or n < 1) then
    error("part:read: n must be a positive number (got " .. tostring(n) .. ")", 2)
  end
  if self._done then return nil end
  local st = self._st
  if st.cur ~= self then return nil end
  local data = st.rest
  if data then
    st.rest = nil
  else
    local kind, v = step(st)
    if kind == "data" then
      data = v
    elseif kind == "end" then
      self._done = true
      return nil
    else
      self._done = true
      return nil, st.err and st.err.message or "multipart: the body ended"
    end
  end
  if n and #data > n then
    st.rest = sub(data, n + 1)
    data = sub(data, 1, n)
  end
  return data
end

-- part:body(): all of the part's data as one string, or nil and a message.
function Part:body()
  local buf, k = {}, 0
  while true do
    local d, err = self:read()
    if not d then
      if err then return nil, err end
      return concat(buf)
    end
    k = k + 1
    buf[k] = d
  end
end

-- part:save(path): writes the part's data to a new file at path (replaced
-- if it exists), straight from the parser (no Lua strings); the bytes
-- written, or nil and a message (the file is removed then).
function Part:save(path)
  if type(path) ~= "string" then error("part:save: path must be a string (got " .. type(path) .. ")", 2) end
  local st = self._st
  if self._done or st.cur ~= self then return nil, "part:save: the part was read already" end
  local f, oerr = io_open(path, "wb")
  if not f then return nil, oerr end
  f:setvbuf("no") -- the pieces are 64 KiB: one write(2) each, not a 4 KiB flush and the rest
  local total, err = 0, nil
  if st.rest then
    f:write(st.rest)
    total = #st.rest
    st.rest = nil
  end
  while not st.err do
    if st.chunk then -- what is left of a piece read already
      local kind, wrote, off = st.p:save(st.chunk, st.off, f)
      if kind == nil then
        fail(st, wrote, off)
        break
      end
      total = total + wrote
      if kind == "end" then
        st.off = off
        break
      end
      st.chunk = nil -- "more": the next piece
    elseif st.req then
      -- a streamed body: the parser takes the connection's bytes where
      -- they are and writes the data from there (no Lua string per piece)
      local kind, wrote, status = save_now(st.req, st.p, f)
      if kind == nil then
        fail(st, wrote, status or (wrote == "too large" and 413 or 400))
        break
      end
      total = total + wrote
      if kind == "end" then break end
      if kind == "eof" then
        fail(st, "the body ended inside the multipart data", 400)
        break
      end
      read_wait(st.req, true) -- bytes came (or the body ended, or failed)
    else
      -- the pieces read so far are garbage: collect them as they go, so
      -- that a big upload's memory stays at a piece or two
      collect("step", 0)
      local c, rerr = st.src()
      if c == nil then
        if rerr then fail(st, rerr, rerr == "too large" and 413 or 400)
        else fail(st, "the body ended inside the multipart data", 400) end
        break
      end
      st.chunk, st.off = c, 0
    end
  end
  if st.err then err = st.err.message end
  self._done = true
  local ok, cerr = f:close()
  if err or not ok then
    os_remove(path)
    return nil, err or cerr
  end
  return total
end

local function new_part(st, block)
  local headers = parse_headers(block)
  local cd = headers["content-disposition"]
  local p = cd and params(cd:match(";(.*)$") or "") or {}
  return setmetatable({ _st = st, _done = false, headers = headers, name = p.name,
    filename = p.filename, content_type = headers["content-type"] }, Part)
end

-- Drains what is left of the body after the closing delimiter, so the
-- connection can be kept alive.
local function drain(st)
  while st.src() do end
end

local function options(opts, what)
  local o = {}
  for k, v in pairs(DEFAULTS) do o[k] = v end
  if opts == nil then return o end
  if type(opts) ~= "table" then error(what .. ": options must be a table (got " .. type(opts) .. ")", 3) end
  for k, v in pairs(opts) do
    if DEFAULTS[k] == nil then error(what .. ": unknown option " .. tostring(k), 3) end
    if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
      error(what .. ": " .. k .. " must be a positive whole number (got " .. tostring(v) .. ")", 3)
    end
    o[k] = v
  end
  return o
end

-- req: the request of a streamed body (part:save reads it from C), or nil
local function new_walk(boundary, src, o, req)
  local p = core.multipart.new(boundary, o.max_parts, o.max_header, o.max_part)
  if not p then return nil end
  return { p = p, src = src, req = req, chunk = nil, off = 0, cur = nil, rest = nil, err = nil,
    over = false }
end

-- req:parts([opts]): an iterator over the parts of a multipart/form-data
-- request; opts: max_parts (100), max_header (bytes of one part's header
-- block, 8192), max_part (bytes of one part's data, no limit but max_body).
-- A part not read to its end is skipped when the loop goes on.
function M.parts(req, opts)
  local o = options(opts, "req:parts")
  local b = M.boundary(req.headers["content-type"])
  local st = b and new_walk(b, source(req), o, rawget(req, "body") == nil and req or nil)
  if not st then
    error(M.http_error(400, b and "multipart: bad boundary" or
      "multipart: the request is not multipart/form-data"), 2)
  end
  return function()
    if st.over then return nil end
    local cur = st.cur
    if cur and not cur._done then
      st.rest = nil
      repeat local d = cur:read() until not d
    end
    st.rest = nil
    local kind, v = step(st)
    while kind == "data" or kind == "end" do kind, v = step(st) end -- a part left unread
    if kind == "part" then
      st.cur = new_part(st, v)
      return st.cur
    end
    st.over = true
    st.p:close()
    if kind == "done" then
      drain(st)
      return nil
    end
    error(st.err or M.http_error(400, "multipart: the body ended inside the multipart data"), 2)
  end
end

-- fields(body, content_type, into): the fields (parts without a filename)
-- of a whole multipart body into `into`; a file part is skipped, a bad
-- body stops quietly (req.form is best-effort; req:parts() says why).
function M.fields(body, ct, into)
  local b = M.boundary(ct)
  local st = b and new_walk(b, source({ body = body }), DEFAULTS)
  if not st then return into end
  while true do
    local kind, v = step(st)
    if kind ~= "part" then break end
    local part = new_part(st, v)
    st.cur = part
    local data = part:body()
    if not data then break end
    if part.name and part.filename == nil then
      into[part.name] = data -- a repeated name keeps its last value, as in a query
    end
  end
  st.p:close()
  return into
end

return M
