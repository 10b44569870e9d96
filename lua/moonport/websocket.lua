-- SPDX-License-Identifier: MIT
-- mp.websocket(url, opts): a WebSocket client (RFC 6455) in callback
-- style, like the server's websocket handlers. The socket is an mp.connect
-- connection; the frames are the server's C code (src/lx/lx_wsc.c over
-- src/http/ws.c): the reader that gathers fragments up to max_msg, masked
-- frames with a fresh random key each, the handshake key and the 101's
-- parse. What is here is the protocol's state: the handshake's checks,
-- pings answered with pongs, the close handshake both ways.
--
-- States: "connecting" (TCP and the handshake), "open", "closing" (a close
-- frame went out, sent or echoed; the TCP connection ends next), "closed".
-- Handshake failures go to on_error(ws, err) and never to on_close; an open
-- connection ends in exactly one on_close(ws, code, reason).
local core = require("moonport.core").wsc
local urlp = require("moonport.url")
local addrfilter = require("moonport.addrfilter")
local type, tostring, error, pairs, ipairs = type, tostring, error, pairs, ipairs
local concat, char, sub, lower = table.concat, string.char, string.sub, string.lower
local match = string.match
local setmetatable = setmetatable

local OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
local NO_STATUS, ABNORMAL = 1005, 1006

-- After a close frame goes out, the peer has this long to answer it.
local CLOSE_WAIT_MS = 5000

local REASONS = {
  [1002] = "protocol error",
  [1007] = "text not UTF-8",
  [1009] = "message too big",
  [1011] = "internal error",
}

local M = {}
local WS = {}
WS.__index = WS

local function mp() return require("moonport") end

-- The close codes a script may send (RFC 6455 7.4.1; 1004-1006 and
-- 1015 are never sent).
local function code_ok(code)
  if type(code) ~= "number" or code % 1 ~= 0 then return false end
  return (code >= 1000 and code <= 1003) or (code >= 1007 and code <= 1014)
      or (code >= 3000 and code <= 4999)
end

local function close_payload(code, reason)
  if code == NO_STATUS then return "" end
  return char(math.floor(code / 256), code % 256) .. (reason or "")
end

-- ---- the object ----

function WS:send(data, is_text)
  if type(data) ~= "string" then error("ws:send: data must be a string", 2) end
  if self._state ~= "open" then return nil, "closed" end
  if is_text == nil then
    is_text = core.utf8(data)
  elseif is_text and not core.utf8(data) then
    error("ws:send: is_text with bytes that are not UTF-8", 2)
  end
  local op = is_text and OP_TEXT or OP_BINARY
  -- permessage-deflate agreed: the message deflated, RSV1 (64) on its
  -- first frame
  local z = self._reader:deflate(data)
  if z then data, op = z, op + 64 end
  local frag = self._fragment
  if not frag or #data <= frag then return self._conn:write(core.frame(op, true, data)) end
  -- opts.fragment: a long message goes as frames of at most that many
  -- bytes, the first with the opcode, the rest continuations
  local n = #data
  local parts = {}
  for at = 1, n, frag do
    parts[#parts + 1] = core.frame(at == 1 and op or OP_CONT, at + frag > n, sub(data, at, at + frag - 1))
  end
  return self._conn:write(concat(parts))
end

function WS:ping(data)
  data = data or ""
  if type(data) ~= "string" or #data > 125 then
    error("ws:ping: data must be a string of at most 125 bytes", 2)
  end
  if self._state ~= "open" then return nil, "closed" end
  return self._conn:write(core.frame(OP_PING, true, data))
end

-- Sends a close frame and ends the connection when the peer answers (or
-- after CLOSE_WAIT_MS).
local function start_close(self, code, reason)
  self._state = "closing"
  self._conn:write(core.frame(OP_CLOSE, true, close_payload(code, reason)))
  local conn = self._conn
  self._close_timer = mp().after(CLOSE_WAIT_MS, function() conn:close(true) end)
end

function WS:close(code, reason)
  code = code or 1000
  reason = reason or ""
  if not code_ok(code) then
    error("ws:close: code must be 1000-1003, 1007-1014 or 3000-4999 (got " .. tostring(code) .. ")", 2)
  end
  if type(reason) ~= "string" or #reason > 123 then
    error("ws:close: reason must be a string of at most 123 bytes", 2)
  end
  if self._state == "connecting" then
    self._state = "closed"
    if self._hs_timer then self._hs_timer:stop() end
    self._hs_timer = nil
    self._conn:close(true)
    return true
  end
  if self._state ~= "open" then return nil, "closed" end
  self._code, self._reason = code, reason
  start_close(self, code, reason)
  return true
end

-- ---- waiting style: no handlers given, ws:receive() ----

-- Messages a waiting client holds before it stops reading (the server
-- then meets TCP back pressure); reading resumes below half.
local QUEUE_MAX = 64

function WS:receive(timeout)
  if not self._queue then error("ws:receive: only for a client made without handlers", 2) end
  local q = self._queue
  if q.first <= q.last then
    local data, is_text = q[q.first], q[q.first + 1]
    q[q.first], q[q.first + 1] = nil, nil
    q.first = q.first + 2
    if self._paused and (q.last - q.first + 1) / 2 < QUEUE_MAX / 2 then
      self._paused = false
      self._conn:resume()
    end
    return data, is_text
  end
  if self._state ~= "open" then return nil, "closed", self._code or ABNORMAL, self._reason or "" end
  if self._waiter then error("ws:receive: another coroutine is already waiting", 2) end
  local data, is_text, code, reason = mp().wait(function(wake) self._waiter = wake end, timeout)
  self._waiter = nil
  return data, is_text, code, reason
end

-- The handlers of a waiting client: messages to the queue or a waiter.
local function waiting_handlers(self)
  local h = {}
  h.on_open = function() if self._wake_open then self._wake_open(true) end end
  h.on_error = function(_, err) if self._wake_open then self._wake_open(nil, err) end end
  h.on_message = function(_, data, is_text)
    local w = self._waiter
    if w then
      self._waiter = nil
      w(data, is_text)
      return
    end
    local q = self._queue
    q[q.last + 1], q[q.last + 2] = data, is_text
    q.last = q.last + 2
    if not self._paused and (q.last - q.first + 1) / 2 >= QUEUE_MAX then
      self._paused = true
      self._conn:pause()
    end
  end
  h.on_close = function(_, code, reason)
    local w = self._waiter
    if w then
      self._waiter = nil
      w(nil, "closed", code, reason)
    end
  end
  return h
end

function WS:protocol() return self._protocol end
function WS:is_open() return self._state == "open" end
function WS:state() return self._state end
function WS:peer() return self._conn:peer() end
function WS:pending() return self._conn:pending() end

-- ---- the connection's events ----

local function fail_handshake(self, err)
  if self._state ~= "connecting" then return end
  self._state = "closed"
  if self._hs_timer then self._hs_timer:stop() end
  self._conn:close(true)
  local on_error = self._h.on_error
  if on_error then
    on_error(self, err)
  else
    mp().log("warn", "mp.websocket " .. self._url .. ": " .. err)
  end
end

-- A token list ("Upgrade, keep-alive") holds `want`, case-insensitively.
local function has_token(v, want)
  for t in (v or ""):gmatch("[^,%s]+") do
    if lower(t) == want then return true end
  end
  return false
end

-- The 101 checked; returns the error, or nil and the chosen subprotocol.
local function check_101(self, status, headers)
  if status ~= 101 then
    return "handshake: status " .. status .. " (not 101 Switching Protocols)"
  end
  if lower(headers["upgrade"] or "") ~= "websocket" then
    return "handshake: no Upgrade: websocket in the 101"
  end
  if not has_token(headers["connection"], "upgrade") then
    return "handshake: no Connection: Upgrade in the 101"
  end
  if headers["sec-websocket-accept"] ~= self._accept then
    return "handshake: wrong Sec-WebSocket-Accept"
  end
  local agreed, err = self._reader:agree(headers["sec-websocket-extensions"])
  if agreed == nil then return err end
  self.compressed = agreed
  local p = headers["sec-websocket-protocol"]
  if p then
    for _, o in ipairs(self._offered) do
      if o == p then return nil, p end
    end
    return "handshake: the server chose subprotocol " .. p .. ", which was not offered"
  end
  return nil, nil
end

-- Bytes in the open state (or the rest after the 101).
local function frames(self, data)
  local ev, fail = self._reader:feed(data)
  local h = self._h
  for i = 1, #ev, 3 do
    if self._state == "closed" or self._got_close then return end
    local op, payload, code = ev[i], ev[i + 1], ev[i + 2]
    if op == OP_TEXT or op == OP_BINARY then
      if self._state == "open" and h.on_message then h.on_message(self, payload, op == OP_TEXT) end
    elseif op == OP_PING then
      if self._state == "open" then self._conn:write(core.frame(OP_PONG, true, payload)) end
    elseif op == OP_PONG then
      if h.on_pong then h.on_pong(self, payload) end
    elseif op == OP_CLOSE then
      self._got_close = true
      if self._state == "open" then -- the peer's close: echoed, then the end
        self._code, self._reason = code, payload
        self._state = "closing"
        self._conn:write(core.frame(OP_CLOSE, true, close_payload(code, "")))
      else -- the answer to ours
        self._code, self._reason = code, payload
      end
      self._conn:close()
      return
    end
  end
  if fail and self._state ~= "closed" and not self._got_close then
    if self._state == "open" then
      self._code, self._reason = fail, REASONS[fail] or ""
      self._state = "closing"
      self._conn:write(core.frame(OP_CLOSE, true, close_payload(fail, self._reason)))
    end
    self._conn:close()
  end
end

local function on_data(self, data)
  if self._state ~= "connecting" then return frames(self, data) end
  local buf = self._head .. data
  local len, status, headers = core.response(buf)
  if len == nil then
    self._head = buf
    return
  end
  if len == false then return fail_handshake(self, status) end
  self._head = nil
  local err, protocol = check_101(self, status, headers)
  if err then return fail_handshake(self, err) end
  if self._hs_timer then self._hs_timer:stop() end
  self._hs_timer = nil
  self._state = "open"
  self._protocol = protocol
  if self._h.on_open then self._h.on_open(self, { status = status, headers = headers }) end
  if #buf > len and self._state == "open" then frames(self, sub(buf, len + 1)) end
end

local function on_closed(self, reason)
  if self._state == "connecting" then
    return fail_handshake(self, "handshake: connection closed (" .. tostring(reason) .. ")")
  end
  if self._close_timer then self._close_timer:stop() end
  local was = self._state
  self._state = "closed"
  if was == "closed" and not self._code then return end -- closed while connecting
  local code, why = self._code, self._reason
  if not self._got_close and not REASONS[code] then
    -- no close frame came back: the connection just dropped
    code, why = ABNORMAL, ""
  end
  if self._h.on_close then self._h.on_close(self, code or ABNORMAL, why or "") end
end

-- ---- mp.websocket ----

local FIELDS = { on_open = "function", on_message = "function", on_close = "function",
  on_error = "function", on_pong = "function", protocols = "table", headers = "table",
  timeout = "number", max_msg = "number", fragment = "number", tls = "table",
  allow = "function", compress = "boolean|table" }

local function bad_header(s) return type(s) ~= "string" or not urlp.value_ok(s) end

-- url -> host, port, target, Host header, tls; or nil, err: mp.fetch's
-- URL parser (moonport.url) with ws and wss for schemes
local WS_SCHEMES = { ws = 80, wss = 443 }
local function parse_url(s)
  local u, err = urlp.parse(s, WS_SCHEMES)
  if not u then
    local scheme = match(err, "^unsupported scheme: (.*)$")
    if scheme then return nil, "mp.websocket: url must be ws:// or wss:// (got " .. scheme .. "://)" end
    return nil, "mp.websocket: " .. err
  end
  return u.host, u.port, u.target, u.authority, u.scheme == "wss"
end

function M.connect(url, opts)
  if type(url) ~= "string" then error("mp.websocket: url must be a string", 2) end
  opts = opts or {}
  if type(opts) ~= "table" then error("mp.websocket: handlers must be a table", 2) end
  for k, v in pairs(opts) do
    local want = FIELDS[k]
    if k == "deny" then
      want = v == false and "boolean" or "table" -- false: not even mp.http's default
    end
    if not want then error("mp.websocket: unknown field " .. tostring(k), 2) end
    if type(v) ~= want and not (want == "boolean|table" and (type(v) == "boolean" or type(v) == "table")) then
      error("mp.websocket: " .. k .. " must be a " .. (want == "boolean|table" and "boolean or a table" or want), 2)
    end
  end
  -- deny / allow as for mp.tcp, checked by mp.connect on the address it
  -- connects to (a bad entry raises here, at the caller)
  if opts.deny ~= nil or opts.allow ~= nil then
    local ok, ferr = addrfilter.new(addrfilter.pick(opts.deny, opts.allow))
    if not ok then error("mp.websocket: " .. ferr, 2) end
  end
  local max_msg = opts.max_msg or 1048576
  if max_msg < 1 or max_msg > 2 ^ 30 or max_msg % 1 ~= 0 then
    error("mp.websocket: max_msg must be an integer from 1 to 2^30", 2)
  end
  local timeout = opts.timeout or 10000
  if timeout <= 0 or timeout > 86400000 then error("mp.websocket: timeout must be 1 to 86400000 ms", 2) end
  local fragment = opts.fragment
  if fragment and (fragment < 1 or fragment % 1 ~= 0) then
    error("mp.websocket: fragment must be a whole number of bytes, at least 1", 2)
  end
  local host, port, target, hosthdr, tls = parse_url(url)
  if not host then return nil, port end
  -- wss://: TLS, the URL's host sent as SNI and verified (opts.tls: the
  -- settings of mp.tcp's tls table, verify / ca / sni / cert / key)
  if tls then tls = opts.tls or true end

  local key = core.key()
  local req = { "GET ", target, " HTTP/1.1\r\nHost: ", hosthdr,
    "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ", key,
    "\r\nSec-WebSocket-Version: 13\r\n" }
  local offered = {}
  for i, p in ipairs(opts.protocols or {}) do
    if type(p) ~= "string" or not match(p, "^[!#$%%&'*+%-.^_`|~%w]+$") then
      error("mp.websocket: protocols[" .. i .. "] must be a token", 2)
    end
    offered[i] = p
  end
  if #offered > 0 then req[#req + 1] = "Sec-WebSocket-Protocol: " .. concat(offered, ", ") .. "\r\n" end
  for k, v in pairs(opts.headers or {}) do
    if bad_header(k) or bad_header(v) or not match(k, "^[!#$%%&'*+%-.^_`|~%w]+$") then
      error("mp.websocket: bad header " .. tostring(k), 2)
    end
    req[#req + 1] = k .. ": " .. v .. "\r\n"
  end
  req[#req + 1] = "\r\n"

  -- no handlers at all: the waiting style (mp.websocket returns once the
  -- handshake is done; messages come from ws:receive)
  local waiting = not (opts.on_open or opts.on_message or opts.on_close or opts.on_error or opts.on_pong)
  local made, reader = pcall(core.reader, max_msg, opts.compress)
  if not made then error("mp.websocket: " .. tostring(reader):gsub("^.-: ", ""), 2) end
  local offer = reader:offer()
  if offer then table.insert(req, #req, "Sec-WebSocket-Extensions: " .. offer .. "\r\n") end
  local self = setmetatable({ env = {}, _state = "connecting", _h = opts, _url = url,
    _accept = core.accept(key), _offered = offered, _head = "",
    _reader = reader, _fragment = fragment, compressed = false }, WS)
  if waiting then
    self._h = waiting_handlers(self)
    self._queue = { first = 1, last = 0 }
  end
  local m = mp()
  self._conn = m.connect {
    host = host, port = port, connect_timeout = timeout / 1000, tls = tls or nil,
    deny = opts.deny, allow = opts.allow,
    on_data = function(_, data) on_data(self, data) end,
    on_close = function(_, reason) on_closed(self, reason) end,
    on_fail = function(_, err)
      if self._state == "connecting" then fail_handshake(self, err) end
    end,
  }
  self._conn:write(concat(req))
  self._hs_timer = m.after(timeout, function()
    self._hs_timer = nil
    fail_handshake(self, "handshake: timeout")
  end)
  if waiting then
    local called, ok, err = pcall(m.wait, function(wake) self._wake_open = wake end)
    if not called then -- not inside a callback: no connection left behind
      self._state = "closed"
      self._conn:close(true)
      error(ok, 2)
    end
    if not ok then return nil, err end
  end
  return self
end

return M
