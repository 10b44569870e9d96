-- Spec: WebSocket (RFC 6455) and Server-Sent Events in mp.http, end to end
-- against the real binary over raw sockets. The client side is written here:
-- frames are built and masked in Lua, server frames are parsed byte by byte.
-- The application is spec/fixtures/ws_app.lua (its header lists the paths).
local H = require "spec.helper"
local ffi = require "ffi"
local bit = require "bit"
local cjson = require "cjson"

local FIXTURE = "ws_app.lua"
local band, bor, bxor, rshift, lshift = bit.band, bit.bor, bit.bxor, bit.rshift, bit.lshift

local OP_CONT, OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10

---------------------------------------------------------------------------
-- Servers
---------------------------------------------------------------------------

local start_server, cleanup = H.fixture_servers(FIXTURE)

-- The server the test started last, and the connection ids its "open"
-- lines named, in the order this test connected (its lanes print in any
-- order, so the last line printed is not always the last connection).
local current_srv
local opened = {} -- path -> id of the last connection made to it
local seen = {}   -- path -> how many of its open lines are taken

-- Starts ws_app.lua on a fresh port. `extra`: "key=value" arguments;
-- sopts.workers: -w N.
local function start(extra, sopts)
  local srv, port = start_server(extra, sopts)
  current_srv, seen, opened = srv, {}, {}
  return srv, port
end

-- No Lua error, pub/sub trouble or crash was logged.
local function assert_clean_log(srv)
  for _, l in ipairs(H.lines(srv:stderr())) do
    assert.is_nil(l:find("error", 1, true), "stderr: " .. srv:stderr())
    assert.is_nil(l:find("pub/sub", 1, true), "stderr: " .. srv:stderr())
  end
  assert.is_true(srv:alive(), srv:describe())
end

---------------------------------------------------------------------------
-- Frames
---------------------------------------------------------------------------

local function xor_mask(payload, key)
  local n = #payload
  if n == 0 then return "" end
  local buf = ffi.new("uint8_t[?]", n)
  ffi.copy(buf, payload, n)
  local k = { key:byte(1, 4) }
  for i = 0, n - 1 do buf[i] = bxor(buf[i], k[band(i, 3) + 1]) end
  return ffi.string(buf, n)
end

local function be(n, bytes)
  local t = {}
  for i = bytes - 1, 0, -1 do
    t[#t + 1] = string.char(math.floor(n / 2 ^ (8 * i)) % 256)
  end
  return table.concat(t)
end

local keyseed = 0
local function mask_key()
  keyseed = keyseed + 1
  return string.char(0x37 + keyseed % 100, 0xfa, 0x21 + keyseed % 7, 0x3d)
end

--- A client frame. o.fin (default true), o.rsv (bits 4-6 value, 0..7),
--- o.mask (default true), o.len (the length claimed in the head; default
--- #payload), o.head_only (no payload bytes).
local function frame(op, payload, o)
  o = o or {}
  payload = payload or ""
  local fin = o.fin ~= false
  local b0 = bor(fin and 0x80 or 0, lshift(o.rsv or 0, 4), op)
  local len = o.len or #payload
  local masked = o.mask ~= false
  local mbit = masked and 0x80 or 0
  local head
  if len < 126 then head = string.char(b0, bor(mbit, len))
  elseif len <= 0xffff then head = string.char(b0, bor(mbit, 126)) .. be(len, 2)
  else head = string.char(b0, bor(mbit, 127)) .. be(len, 8) end
  if o.head_only then
    return head .. (masked and mask_key() or "")
  end
  if masked then
    local key = mask_key()
    return head .. key .. xor_mask(payload, key)
  end
  return head .. payload
end

local function close_frame(code, reason, o)
  return frame(OP_CLOSE, (code and be(code, 2) or "") .. (reason or ""), o)
end

local WS = {}
WS.__index = WS

--- Parses one server frame from the front of buffer `s`: frame, rest; or nil
--- if it is not whole yet.
local function parse_frame(s)
  if #s < 2 then return nil end
  local b0, b1 = s:byte(1, 2)
  local len, pos = band(b1, 0x7f), 3
  if len == 126 then
    if #s < 4 then return nil end
    len = s:byte(3) * 256 + s:byte(4)
    pos = 5
  elseif len == 127 then
    if #s < 10 then return nil end
    len = 0
    for i = 3, 10 do len = len * 256 + s:byte(i) end
    pos = 11
  end
  local masked = band(b1, 0x80) ~= 0
  local key
  if masked then
    if #s < pos + 3 then return nil end
    key = s:sub(pos, pos + 3)
    pos = pos + 4
  end
  if #s < pos + len - 1 then return nil end
  local payload = s:sub(pos, pos + len - 1)
  if masked then payload = xor_mask(payload, key) end
  local f = {
    fin = band(b0, 0x80) ~= 0, rsv = band(rshift(b0, 4), 7), op = band(b0, 0x0f),
    masked = masked, len = len, head_len = pos - 1 - (masked and 4 or 0),
    payload = payload,
  }
  if f.op == OP_CLOSE and len >= 2 then
    f.code = payload:byte(1) * 256 + payload:byte(2)
    f.reason = payload:sub(3)
  end
  return f, s:sub(pos + len)
end

-- Reads from client.c onto client.buf until take(client.buf) returns a
-- value and the rest of the buffer (which is kept); returns the value, or
-- nil, err if reading fails first (within timeout, default H.T(5) s).
local function read_until_taken(client, timeout, take)
  local deadline = H.now() + (timeout or H.T(5))
  while true do
    local v, rest = take(client.buf)
    if v then
      client.buf = rest
      return v
    end
    local d, err = H.read_some(client.c, math.max(0, deadline - H.now()))
    if not d then return nil, err end
    client.buf = client.buf .. d
  end
end

--- The next frame from the server, or nil, err ("timeout", "closed", ...).
function WS:frame(timeout) return read_until_taken(self, timeout, parse_frame) end

--- The next data frame (text/binary), answering nothing; control frames other
--- than close are skipped (pings are counted).
function WS:message(timeout)
  while true do
    local f, err = self:frame(timeout)
    if not f then return nil, err end
    if f.op == OP_PING then self.pings = (self.pings or 0) + 1
    elseif f.op ~= OP_PONG then return f end
  end
end

function WS:send(data) return assert(H.send(self.c, data)) end
function WS:text(s) return self:send(frame(OP_TEXT, s)) end
function WS:binary(s) return self:send(frame(OP_BIN, s)) end

--- Sends a text message and returns the payload of the reply.
function WS:echo(s, timeout)
  self:text(s)
  local f, err = self:message(timeout)
  assert.truthy(f, "no reply to " .. s:sub(1, 40) .. ": " .. tostring(err))
  return f.payload, f
end

--- Expects a close frame with `code` and then the end of the TCP connection.
function WS:expect_close(code, timeout)
  local f, err = self:message(timeout)
  assert.truthy(f, ("expected a close frame %d, got %s"):format(code, tostring(err)))
  assert.equal(OP_CLOSE, f.op, "expected a close frame, got opcode " .. f.op)
  assert.equal(code, f.code)
  assert.is_false(f.masked, "server frames must not be masked")
  local rest, how = H.read_to_eof(self.c, timeout or H.T(5))
  assert.truthy(rest, "TCP connection not closed after the close frame: " .. tostring(how))
  assert.equal("", rest)
  return f
end

--- Expects the TCP connection to end (data before it is returned).
function WS:expect_eof(timeout)
  local data, how = H.read_to_eof(self.c, timeout or H.T(5))
  assert.truthy(data, "connection not closed: " .. tostring(how))
  return self.buf .. data
end

local function handshake(path, o)
  o = o or {}
  local lines = {
    ("%s %s HTTP/%s"):format(o.method or "GET", path, o.version or "1.1"),
    "Host: localhost",
    "Upgrade: websocket",
    "Connection: Upgrade",
  }
  if o.key ~= false then
    lines[#lines + 1] = "Sec-WebSocket-Key: " .. (o.key or "dGhlIHNhbXBsZSBub25jZQ==")
  end
  if o.version_header ~= false then
    lines[#lines + 1] = "Sec-WebSocket-Version: " .. (o.ws_version or "13")
  end
  for _, h in ipairs(o.headers or {}) do lines[#lines + 1] = h end
  return table.concat(lines, "\r\n") .. "\r\n\r\n"
end

--- Reads an HTTP response head from c (with leftover bytes after it).
local function read_head(c, timeout)
  local buf, err = H.read_until(c, "\r\n\r\n", timeout or H.T(5))
  assert.truthy(buf, "no response head: " .. tostring(err))
  local at = buf:find("\r\n\r\n", 1, true)
  local head, rest = buf:sub(1, at + 1), buf:sub(at + 4)
  local status = tonumber(head:match("^HTTP/1%.1 (%d%d%d) "))
  local headers = {}
  for k, v in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do headers[k:lower()] = v end
  return { status = status, headers = headers, head = head }, rest
end

--- A WebSocket client on `path`, after a successful handshake. `extra` is
--- sent right behind the handshake, in the same write.
local function ws_connect(port, path, o)
  o = o or {}
  local c = H.connect(port, o.connect)
  assert(H.send(c, handshake(path, o) .. (o.extra or "")))
  local r, rest = read_head(c)
  assert.equal(101, r.status, r.head)
  local ws = setmetatable({ c = c, buf = rest, resp = r }, WS)
  if current_srv and not o.no_id then
    -- this connection's on_open line: the next one for its path (each
    -- connect waits for its line, so they come in the order of connects;
    -- ids of two worker processes may be equal)
    local p = path:match("^[^?]*")
    local n = seen[p] or 0
    H.wait_for(function()
      local k = 0
      for _, l in ipairs(current_srv:stdout_lines("^open ")) do
        local id, lp = l:match("^open (%S+) (%S+)$")
        if lp == p then
          k = k + 1
          if k == n + 1 then
            seen[p], opened[p], ws.id = k, id, id
            return true
          end
        end
      end
    end, H.T(5), "the open line of a connection to " .. p)
  end
  return ws
end

--- Reads "hello ..." sent by /sub and /subfn on_open.
local function sub_client(port, path)
  local ws = ws_connect(port, path)
  local f = assert(ws:message())
  assert.truthy(f.payload:match("^hello"), f.payload)
  ws.pid = tonumber(f.payload:match("pid=(%d+)"))
  return ws
end

--- A simple HTTP GET (Connection: close); returns status, body.
local function http_get(port, target)
  local c = H.connect(port)
  assert(H.send(c, ("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):format(target)))
  local data = H.read_to_eof(c)
  assert.truthy(data, "no response to " .. target)
  c:close()
  local status = tonumber(data:match("^HTTP/1%.1 (%d%d%d)"))
  local body = data:match("\r\n\r\n(.*)$")
  return status, body, data
end

local function pct(s)
  return (s:gsub("[^%w]", function(ch) return ("%%%02X"):format(ch:byte()) end))
end

local function publish(port, ch, msg)
  local st, body = http_get(port, ("/pub?ch=%s&msg=%s"):format(pct(ch), pct(msg)))
  assert.equal(200, st)
  assert.equal("ok", body)
end

-- Publishes `msg` on `ch` and checks the next message of client `ws` is
-- `payload` (default msg) in a frame of opcode `op`.
local function publish_expect(port, ws, ch, msg, op, payload)
  publish(port, ch, msg)
  local f = assert(ws:message())
  assert.same({ op, payload or msg }, { f.op, f.payload })
end

-- Id of the connection this test made last to `path`.
local function last_open_id(srv, path)
  return opened[path]
end

-- Waits for the "close <id> ..." line; returns code, reason.
local function wait_close_line(srv, id)
  local pat = "close " .. id .. " "
  H.wait_for(function()
    for _, l in ipairs(srv:stdout_lines()) do
      if l:sub(1, #pat) == pat then return true end
    end
  end, H.T(5), function() return "on_close of " .. id .. ": " .. srv:describe() end)
  for _, l in ipairs(srv:stdout_lines()) do
    if l:sub(1, #pat) == pat then
      local _, _, code, reason = l:match("^close (%S+) (%S+) (%S+) ?(.*)$")
      return tonumber(code), reason
    end
  end
end

-- Clients of a -w 2 server on both workers: calls connect() (a client
-- with .pid, the process serving it) up to 60 times, until at least 4
-- clients are on two processes. Returns the clients and how many
-- processes they reached.
local function on_both_workers(connect)
  local clients, pids, npids = {}, {}, 0
  for _ = 1, 60 do
    local c = connect()
    clients[#clients + 1] = c
    if not pids[c.pid] then pids[c.pid] = true; npids = npids + 1 end
    if npids >= 2 and #clients >= 4 then break end
  end
  return clients, npids
end

-- Publishes "probe" on `ch` until every client has had one (every worker
-- knows every subscription), then has /pubseq publish "seq 1" .. "seq n"
-- from one lane; checks every client gets them all in order (probes
-- skipped). next_text(client, timeout) is the text of the client's next
-- message, or nil and why; `what` names a client in failure messages.
local function probe_then_sequence(port, ch, clients, n, next_text, what)
  local probed = {}
  H.wait_for(function()
    publish(port, ch, "probe")
    for i, c in ipairs(clients) do
      while not probed[i] do
        local t = next_text(c, 0.05)
        if not t then break end
        if t == "probe" then probed[i] = true end
      end
    end
    for i = 1, #clients do if not probed[i] then return false end end
    return true
  end, H.T(10), "every " .. what .. " to get a probe")
  assert.equal(200, (http_get(port, ("/pubseq?ch=%s&n=%d"):format(ch, n))))
  for i, c in ipairs(clients) do
    local got = {}
    while #got < n do
      local t, err = next_text(c, H.T(5))
      assert.truthy(t, ("%s %d (pid %d) after %d: %s"):format(what, i, c.pid, #got, tostring(err)))
      if t ~= "probe" then got[#got + 1] = t end
    end
    for k = 1, n do assert.equal("seq " .. k, got[k], what .. " " .. i) end
  end
end

-- Every byte value, repeated to n bytes.
local function gen(n)
  local b = {}
  for i = 0, 255 do b[#b + 1] = string.char(i) end
  return table.concat(b):rep(math.ceil(n / 256) + 1):sub(1, n)
end

local function text_of(n)
  return ("abcdefghijklmnopqrstuvwxyz0123456789"):rep(math.ceil(n / 36) + 1):sub(1, n)
end

---------------------------------------------------------------------------

describe("WebSocket", function()
  after_each(cleanup)

  describe("handshake", function()
    it("answers 101 with the RFC 6455 sample key's Sec-WebSocket-Accept", function()
      local _, port = start()
      local ws = ws_connect(port, "/echo", { headers = {
        "Sec-WebSocket-Protocol: chat, superchat",
        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits" } })
      local h = ws.resp.headers
      -- RFC 6455 1.3: key dGhlIHNhbXBsZSBub25jZQ== -> s3pPLMBiTxaQ9kYGzzhZRbK+xOo=
      assert.equal("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", h["sec-websocket-accept"])
      assert.equal("websocket", (h["upgrade"] or ""):lower())
      assert.truthy((h["connection"] or ""):lower():find("upgrade", 1, true))
      assert.is_nil(h["sec-websocket-extensions"])
      assert.is_nil(h["sec-websocket-protocol"])
      assert.equal("hi", (ws:echo("hi")))
    end)

    it("refuses with 400: a missing key, a short key, POST, HTTP/1.0", function()
      local srv, port = start()
      local cases = {
        { key = false }, { key = "c2hvcnQ=" }, { method = "POST" }, { version = "1.0" },
      }
      for i, o in ipairs(cases) do
        local c = H.connect(port)
        local req = handshake("/echo", o)
        if o.method == "POST" then req = req:gsub("\r\n\r\n$", "\r\nContent-Length: 0\r\n\r\n") end
        assert(H.send(c, req))
        local r = read_head(c)
        assert.equal(400, r.status, "case " .. i .. ": " .. r.head)
        assert.truthy(H.read_to_eof(c), "case " .. i .. ": connection stays open")
      end
      assert.equal(0, #srv:stdout_lines("^open "))
    end)

    it("answers 426 with Sec-WebSocket-Version: 13 to version 8", function()
      local srv, port = start()
      local c = H.connect(port)
      assert(H.send(c, handshake("/echo", { ws_version = "8" })))
      local r = read_head(c)
      assert.equal(426, r.status, r.head)
      assert.equal("13", r.headers["sec-websocket-version"])
      assert.equal(0, #srv:stdout_lines("^open "))
    end)

    it("sends an upgrade request to on_request when there are no websocket handlers", function()
      local _, port = start { "nows=1" }
      local c = H.connect(port)
      assert(H.send(c, handshake("/echo")))
      local r, rest = read_head(c)
      assert.equal(200, r.status, r.head)
      local n = tonumber(r.headers["content-length"])
      local body = rest .. (H.read_exact(c, n - #rest) or "")
      assert.equal("plain GET /echo upgrade=websocket", body)
    end)

    it("takes Upgrade and Connection tokens case-insensitively and inside lists", function()
      local _, port = start()
      local c = H.connect(port)
      local req = handshake("/echo"):gsub("Upgrade: websocket", "Upgrade: WebSocket")
        :gsub("Connection: Upgrade", "Connection: keep-alive, upgrade")
      assert(H.send(c, req))
      local r, rest = read_head(c)
      assert.equal(101, r.status, r.head)
      local ws = setmetatable({ c = c, buf = rest }, WS)
      assert.equal("ok", (ws:echo("ok")))
    end)

    it("upgrades a connection whose first request was a plain one (pipelined)", function()
      local _, port = start()
      local c = H.connect(port)
      assert(H.send(c, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" .. handshake("/echo")
        .. frame(OP_TEXT, "after upgrade")))
      local r1, rest = read_head(c)
      assert.equal(200, r1.status, r1.head)
      local n = tonumber(r1.headers["content-length"])
      while #rest < n do rest = rest .. assert(H.read_some(c)) end
      assert.equal("plain GET /hello upgrade=nil", rest:sub(1, n))
      -- the 101 follows in the same stream
      local cs = setmetatable({ buf = rest:sub(n + 1) }, { __index = {} })
      local buf = cs.buf
      while not buf:find("\r\n\r\n", 1, true) do buf = buf .. assert(H.read_some(c)) end
      local at = buf:find("\r\n\r\n", 1, true)
      assert.truthy(buf:find("^HTTP/1%.1 101 "), buf)
      local ws = setmetatable({ c = c, buf = buf:sub(at + 4) }, WS)
      local f = assert(ws:message())
      assert.same({ OP_TEXT, "after upgrade" }, { f.op, f.payload })
    end)

    it("processes frames sent in the same packet as the handshake", function()
      local _, port = start()
      local ws = ws_connect(port, "/echo", {
        extra = frame(OP_TEXT, "early one") .. frame(OP_BIN, "\1\2early two"),
      })
      local a = assert(ws:message())
      local b = assert(ws:message())
      assert.same({ OP_TEXT, "early one" }, { a.op, a.payload })
      assert.same({ OP_BIN, "\1\2early two" }, { b.op, b.payload })
    end)
  end)

  describe("messages", function()
    it("echoes text and binary of 0, 125, 126, 65535, 65536 bytes and 1 MiB with the right length encodings", function()
      local srv, port = start()
      local ws = ws_connect(port, "/echo")
      for _, n in ipairs { 0, 125, 126, 65535, 65536, 1048576 } do
        for _, op in ipairs { OP_TEXT, OP_BIN } do
          local payload = op == OP_TEXT and text_of(n) or gen(n)
          local head = n < 126 and 2 or (n <= 65535 and 4 or 10)
          local got, err, part = H.exchange(ws.c, frame(op, payload), head + n, H.T(20))
          assert.truthy(got, ("%d bytes op %d: %s after %d bytes"):format(n, op, tostring(err),
            #(part or "")))
          local f, rest = parse_frame(got)
          assert.truthy(f, "no whole frame for " .. n)
          assert.equal("", rest)
          assert.equal(head, f.head_len, "head length for " .. n)
          assert.equal(op, f.op)
          assert.is_true(f.fin)
          assert.is_false(f.masked)
          assert.equal(0, f.rsv)
          assert.equal(n, #f.payload)
          assert.is_true(f.payload == payload, "payload differs at " .. n)
        end
      end
      -- is_text reached on_message as sent
      local lines = srv:stdout_lines("^msg ")
      assert.equal(12, #lines)
      assert.truthy(lines[1]:find(" 0 text$"), lines[1])
      assert.truthy(lines[2]:find(" 0 binary$"), lines[2])
      assert.truthy(lines[11]:find(" 1048576 text$"), lines[11])
      assert.truthy(lines[12]:find(" 1048576 binary$"), lines[12])
    end)

    it("reads frames that arrive one byte per write", function()
      local _, port = start()
      local ws = ws_connect(port, "/echo")
      local data = frame(OP_TEXT, "slow") .. frame(OP_BIN, text_of(300)) .. frame(OP_PING, "p")
      for i = 1, #data do
        assert(H.send(ws.c, data:sub(i, i)))
        if i % 16 == 0 or i < 20 then H.sleep(0.001) end
      end
      local a = assert(ws:frame())
      local b = assert(ws:frame())
      local p = assert(ws:frame())
      assert.same({ OP_TEXT, "slow" }, { a.op, a.payload })
      assert.same({ OP_BIN, text_of(300) }, { b.op, b.payload })
      assert.same({ OP_PONG, "p" }, { p.op, p.payload })
    end)

    it("answers many frames sent in one write, in order", function()
      local _, port = start()
      local ws = ws_connect(port, "/echo")
      local parts = {}
      for i = 1, 200 do parts[i] = frame(OP_TEXT, "m" .. i) end
      ws:send(table.concat(parts))
      for i = 1, 200 do
        local f = assert(ws:message())
        assert.equal("m" .. i, f.payload)
      end
    end)

    it("joins fragments (a UTF-8 character split across them) and answers a ping between them", function()
      local srv, port = start()
      local ws = ws_connect(port, "/echo")
      local text = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x8c\x99"   -- café € 🌙
      -- split inside é, inside €, and inside the 4-byte moon
      local cuts = { 5, 9, 13, #text }
      local from = 1
      for i, to in ipairs(cuts) do
        local op = i == 1 and OP_TEXT or OP_CONT
        ws:send(frame(op, text:sub(from, to), { fin = i == #cuts }))
        if i == 2 then ws:send(frame(OP_PING, "between")) end
        from = to + 1
      end
      local p = assert(ws:frame())
      assert.same({ OP_PONG, "between" }, { p.op, p.payload })
      local m = assert(ws:frame())
      assert.same({ OP_TEXT, true, text }, { m.op, m.fin, m.payload })
      -- a fragmented binary message is reported as binary
      ws:send(frame(OP_BIN, "\0\1", { fin = false }) .. frame(OP_CONT, "", { fin = false })
        .. frame(OP_CONT, "\2"))
      m = assert(ws:frame())
      assert.same({ OP_BIN, "\0\1\2" }, { m.op, m.payload })
      local lines = srv:stdout_lines("^msg ")
      assert.truthy(lines[1]:find((" %d text$"):format(#text)), lines[1])
      assert.truthy(lines[2]:find(" 3 binary$"), lines[2])
    end)

    it("joins a 1 MiB message sent as 16 fragments of 64 KiB (max_msg exactly)", function()
      local _, port = start()
      local ws = ws_connect(port, "/echo")
      local payload = gen(1048576)
      local parts = {}
      for i = 0, 15 do
        parts[#parts + 1] = frame(i == 0 and OP_BIN or OP_CONT,
          payload:sub(i * 65536 + 1, (i + 1) * 65536), { fin = i == 15 })
      end
      local got = assert(H.exchange(ws.c, table.concat(parts), 10 + #payload, H.T(20)))
      local f = parse_frame(got)
      assert.same({ OP_BIN, true, 1048576 }, { f.op, f.fin, #f.payload })
      assert.is_true(f.payload == payload)
    end)

    it("answers a ping with a pong carrying the same payload", function()
      local _, port = start()
      local ws = ws_connect(port, "/echo")
      local payload = gen(125)
      ws:send(frame(OP_PING, payload))
      local p = assert(ws:frame())
      assert.equal(OP_PONG, p.op)
      assert.is_true(p.payload == payload)
      ws:send(frame(OP_PONG, "unsolicited"))   -- ignored
      assert.equal("still here", (ws:echo("still here")))
    end)
  end)

  describe("close handshake", function()
    it("client close 1000 + reason: the server echoes 1000, closes TCP, on_close sees both", function()
      local srv, port = start()
      local ws = ws_connect(port, "/echo")
      ws:send(close_frame(1000, "done here"))
      ws:expect_close(1000)
      local code, reason = wait_close_line(srv, last_open_id(srv, "/echo"))
      assert.equal(1000, code)
      assert.equal("done here", reason)
    end)

    it("echoes every valid close code (1001, 1003, 1014, 3000, 4999)", function()
      local srv, port = start()
      for _, code in ipairs { 1001, 1003, 1014, 3000, 4999 } do
        local ws = ws_connect(port, "/echo")
        ws:send(close_frame(code, "r"))
        ws:expect_close(code)
        assert.equal(code, (wait_close_line(srv, last_open_id(srv, "/echo"))))
      end
    end)

    it("a close without payload: on_close sees 1005", function()
      local srv, port = start()
      local ws = ws_connect(port, "/echo")
      ws:send(close_frame())
      local f = assert(ws:message())
      assert.equal(OP_CLOSE, f.op)
      assert.truthy(ws:expect_eof())
      assert.equal(1005, (wait_close_line(srv, last_open_id(srv, "/echo"))))
    end)

    it("ws:close(4001, 'bye'): the client gets it, answers, on_close sees 4001; ws:send then returns nil, 'closed'", function()
      local srv, port = start()
      local ws = ws_connect(port, "/close")
      ws:text("close")
      local f = assert(ws:message())
      assert.equal(OP_CLOSE, f.op)
      assert.equal(4001, f.code)
      assert.equal("bye", f.reason)
      ws:send(close_frame(4001))
      assert.truthy(ws:expect_eof())
      local id = last_open_id(srv, "/close")
      assert.equal(4001, (wait_close_line(srv, id)))
      assert.same({ "after-close " .. id .. " nil closed false" }, srv:stdout_lines("^after%-close "))
    end)

    it("a server close that gets no answer is cut after about 5 s", function()
      local srv, port = start()
      local ws = ws_connect(port, "/close")
      ws:text("close")
      local f = assert(ws:message())
      assert.equal(4001, f.code)
      local t0 = H.now()
      local data, how = H.read_to_eof(ws.c, H.T(5) + 3)
      local dt = H.now() - t0
      assert.truthy(data, "not closed: " .. tostring(how))
      assert.is_true(dt > 3.5, ("closed after %.2f s"):format(dt))
      assert.is_true(dt < H.T(5) + 2.5, ("closed after %.2f s"):format(dt))
      assert.equal(4001, (wait_close_line(srv, last_open_id(srv, "/close"))))
    end)

    it("the 5 s close wait is not restarted by a peer that keeps sending frames", function()
      local srv, port = start()
      local ws = ws_connect(port, "/close")
      ws:text("close")
      local f = assert(ws:message())
      assert.equal(4001, f.code)
      local t0, closed_at = H.now(), nil
      local deadline = t0 + H.T(5) + 3
      while H.now() < deadline do
        -- a ping and a text frame every 0.5 s, never the close answer
        H.send(ws.c, frame(OP_PING, "still here") .. frame(OP_TEXT, "chatter"))
        local stop = H.now() + 0.5
        while H.now() < stop do
          local d, err = H.read_some(ws.c, stop - H.now())
          if not d and err ~= "timeout" then closed_at = H.now() break end
        end
        if closed_at then break end
      end
      assert.truthy(closed_at, ("still open %.1f s after the server's close frame"):format(
        H.now() - t0))
      assert.is_true(closed_at - t0 < H.T(5) + 2.5, ("closed after %.2f s"):format(closed_at - t0))
      assert.equal(4001, (wait_close_line(srv, last_open_id(srv, "/close"))))
      -- the dropped messages never reached on_message
      assert.equal(1, #srv:stdout_lines("^msg "))
    end)

    it("after its own close frame the server still answers a ping (until the peer's close)", function()
      local _, port = start()
      local ws = ws_connect(port, "/close")
      ws:text("close")
      local f = assert(ws:message())
      assert.equal(4001, f.code)
      ws:send(frame(OP_PING, "are you there"))
      local p, err = ws:frame(H.T(2))
      assert.truthy(p, "no pong: " .. tostring(err))
      assert.same({ OP_PONG, "are you there" }, { p.op, p.payload })
      ws:send(close_frame(4001))
      ws:expect_eof()
    end)
  end)

  describe("protocol errors", function()
    -- Each case: send `bad` on a fresh connection, expect a close frame with
    -- `code` and the end of TCP, while a bystander keeps being served.
    local function expect_failure(port, srv, bad, code, o)
      o = o or {}
      local bystander = ws_connect(port, "/echo")
      local ws = ws_connect(port, "/echo")
      ws:send(bad)
      ws:expect_close(code, o.timeout)
      assert.equal("still served", (bystander:echo("still served")))
      local id = last_open_id(srv, "/echo")
      assert.equal(code, (wait_close_line(srv, id)))
      assert.is_true(srv:alive())
    end

    local cases = {
      { "an unmasked frame", function() return frame(OP_TEXT, "x", { mask = false }) end, 1002 },
      { "an RSV1 bit", function() return frame(OP_TEXT, "x", { rsv = 4 }) end, 1002 },
      { "an RSV3 bit", function() return frame(OP_BIN, "x", { rsv = 1 }) end, 1002 },
      { "reserved opcode 3", function() return frame(3, "x") end, 1002 },
      { "reserved opcode 0xB", function() return frame(0xB, "x") end, 1002 },
      { "a fragmented ping", function() return frame(OP_PING, "x", { fin = false }) end, 1002 },
      { "a 126-byte ping", function() return frame(OP_PING, text_of(126)) end, 1002 },
      { "a continuation without a message", function() return frame(OP_CONT, "x") end, 1002 },
      { "a new message inside a fragmented one", function()
        return frame(OP_TEXT, "a", { fin = false }) .. frame(OP_TEXT, "b")
      end, 1002 },
      { "invalid UTF-8 text", function() return frame(OP_TEXT, "ok \xc3\x28 no") end, 1007 },
      { "invalid UTF-8 across fragments", function()
        return frame(OP_TEXT, "\xe2\x82", { fin = false }) .. frame(OP_CONT, "A")
      end, 1007 },
      { "a UTF-16 surrogate in text", function() return frame(OP_TEXT, "\xed\xa0\x80") end, 1007 },
      { "close code 1005", function() return close_frame(1005) end, 1002 },
      { "close code 999", function() return close_frame(999) end, 1002 },
      { "close code 1004", function() return close_frame(1004) end, 1002 },
      { "close code 1015", function() return close_frame(1015) end, 1002 },
      { "close code 1016", function() return close_frame(1016) end, 1002 },
      { "close code 2999", function() return close_frame(2999) end, 1002 },
      { "close code 5000", function() return close_frame(5000) end, 1002 },
      { "a 1-byte close payload", function() return frame(OP_CLOSE, "\3") end, 1002 },
      { "a close reason that is not UTF-8", function() return close_frame(1000, "\xff") end, 1007 },
    }
    for _, case in ipairs(cases) do
      it(case[1] .. " closes with " .. case[3] .. "; other connections go on", function()
        local srv, port = start()
        expect_failure(port, srv, case[2](), case[3])
      end)
    end

    it("a message over max_msg gets 1009 from its head, before the payload is sent", function()
      local srv, port = start { "max_msg=1000" }
      -- exactly max_msg is fine
      local ok = ws_connect(port, "/echo")
      assert.equal(1000, #(ok:echo(text_of(1000))))
      -- only the head (and mask key) of a 1001-byte frame
      expect_failure(port, srv, frame(OP_BIN, nil, { len = 1001, head_only = true }), 1009)
      -- a head that claims 2^40 bytes
      expect_failure(port, srv, frame(OP_BIN, nil, { len = 2 ^ 40, head_only = true }), 1009)
    end)

    it("fragments that add up past max_msg get 1009", function()
      local srv, port = start { "max_msg=1000" }
      local bad = frame(OP_TEXT, text_of(600), { fin = false })
        .. frame(OP_CONT, nil, { len = 600, fin = true, head_only = true })
      expect_failure(port, srv, bad, 1009)
    end)

    it("a head claiming a length with the top bit set is refused", function()
      local srv, port = start()
      local bad = string.char(0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 1) .. "\1\2\3\4"
      local bystander = ws_connect(port, "/echo")
      local ws = ws_connect(port, "/echo")
      ws:send(bad)
      local f = assert(ws:message())
      assert.equal(OP_CLOSE, f.op)
      assert.truthy(f.code == 1002 or f.code == 1009, "code " .. tostring(f.code))
      assert.truthy(ws:expect_eof())
      assert.equal("ok", (bystander:echo("ok")))
      assert.is_true(srv:alive())
    end)
  end)

  describe("Lua side", function()
    it("on_open gets the request's path, query and headers; ws:peer(), ws:id(), ws:is_open()", function()
      local srv, port = start()
      local ws = ws_connect(port, "/info?x=1&y=two", { headers = { "X-Custom: hello" } })
      local f = assert(ws:message())
      local info = cjson.decode(f.payload)
      assert.equal("/info", info.path)
      assert.equal("x=1&y=two", info.query)
      assert.equal("GET", info.method)
      assert.equal("hello", info.headers["x-custom"])
      assert.equal("dGhlIHNhbXBsZSBub25jZQ==", info.headers["sec-websocket-key"])
      assert.equal("127.0.0.1", info.peer_ip)
      local _, myport = ws.c:getsockname()
      assert.equal(tonumber(myport), info.peer_port)
      assert.is_true(info.is_open)
      assert.equal("number", info.id_type)
      assert.equal(last_open_id(srv, "/info"), info.id)
      -- a second connection has another id
      local ws2 = ws_connect(port, "/info")
      local info2 = cjson.decode(assert(ws2:message()).payload)
      assert.are_not.equal(info.id, info2.id)
    end)

    it("ws.env persists between messages of one connection and is private to it", function()
      local _, port = start()
      local a = ws_connect(port, "/env")
      local b = ws_connect(port, "/env")
      assert.equal("n=1 last=nil", (a:echo("one")))
      assert.equal("n=2 last=one", (a:echo("two")))
      assert.equal("n=1 last=nil", (b:echo("other")))
      assert.equal("n=3 last=two", (a:echo("three")))
    end)

    it("an error in on_message is logged and closes only that connection", function()
      local srv, port = start()
      local bystander = ws_connect(port, "/echo")
      local ws = ws_connect(port, "/error")
      assert.equal("fine", (ws:echo("fine")))
      ws:text("boom")
      local rest = ws:expect_eof()
      -- whatever arrived before the end is at most a close frame
      if #rest > 0 then
        local f = parse_frame(rest)
        assert.truthy(f and f.op == OP_CLOSE, ("unexpected bytes %q"):format(rest))
      end
      local line = H.fixture_line(FIXTURE, 'error("boom from on_message")')
      srv:wait_stderr("error in on_message", H.T(5), true)
      local err = srv:stderr()
      assert.truthy(H.plain(err, "boom from on_message"), err)
      assert.truthy(H.plain(err, "ws_app.lua:" .. line), err)
      assert.equal("still served", (bystander:echo("still served")))
      local again = ws_connect(port, "/error")
      assert.equal("new one", (again:echo("new one")))
      assert.is_true(srv:alive())
    end)

    it("an on_message that sleeps keeps the messages in order", function()
      local _, port = start()
      local ws = ws_connect(port, "/sleep")
      ws:send(frame(OP_TEXT, "first") .. frame(OP_TEXT, "second"))
      ws:text("third")
      local got = {}
      for i = 1, 3 do got[i] = assert(ws:message(H.T(5))).payload end
      assert.same({ "first", "second", "third" }, got)
    end)

    it("frames that arrive while on_message sleeps wait for it, however many", function()
      local srv, port = start { "max_msg=1000" }
      local ws = ws_connect(port, "/sleep")
      -- 100 KiB of small messages behind a sleeping one: none is over
      -- max_msg, so none may be refused with 1009
      local parts = { frame(OP_TEXT, "first") }
      for i = 1, 10000 do parts[#parts + 1] = frame(OP_TEXT, ("m%05d"):format(i)) end
      local data = table.concat(parts)
      assert.is_true(#data > 100000)
      ws:send(data)
      local f = assert(ws:message())
      assert.equal("first", f.payload, "close code " .. tostring(f.code))
      for i = 1, 10000 do
        f = assert(ws:message())
        assert.equal(("m%05d"):format(i), f.payload, "close code " .. tostring(f.code))
      end
      assert.is_true(srv:alive())
    end)

    it("an error in on_message with more frames behind it in the same write", function()
      local srv, port = start()
      local ws = ws_connect(port, "/error")
      ws:send(frame(OP_TEXT, "boom") .. frame(OP_TEXT, "after") .. frame(OP_PING, "p")
        .. frame(OP_TEXT, "boom"))
      ws:expect_eof()
      srv:wait_stderr("error in on_message", H.T(5), true)
      assert.equal(1, H.count_lines(srv:stderr(), "error in on_message"))
      -- "after" never reached on_message: the connection was gone
      assert.equal(1, #srv:stdout_lines("^msg "))
      local again = ws_connect(port, "/echo")
      assert.equal("fine", (again:echo("fine")))
    end)

    it("ws:send(not UTF-8, true) raises", function()
      local _, port = start()
      local ws = ws_connect(port, "/badsend")
      local reply = ws:echo("go")
      assert.truthy(reply:find("^raised: "), reply)
      assert.truthy(reply:find("UTF-8", 1, true), reply)
    end)

    it("ws:send with is_text nil picks text for UTF-8 and binary otherwise", function()
      -- the /subfn path sends with is_text nil
      local _, port = start()
      local ws = sub_client(port, "/subfn?ch=kind")
      publish_expect(port, ws, "kind", "t\xc3\xa9xt", OP_TEXT, "fn:t\xc3\xa9xt")
      publish_expect(port, ws, "kind", "\xff\x00", OP_BIN, "fn:\xff\x00")
    end)
  end)

  describe("pub/sub", function()
    it("ws:subscribe(ch) forwards strings as text, non-UTF-8 as binary, tables as JSON text", function()
      local srv, port = start()
      local ws = sub_client(port, "/sub?ch=news")
      publish_expect(port, ws, "news", "hello \xe2\x82\xac", OP_TEXT)
      publish_expect(port, ws, "news", "\x80\x81\xff", OP_BIN)
      publish(port, "other", "not for you")
      assert.equal(200, (http_get(port, "/pubtable?ch=news")))
      local f = assert(ws:message())
      assert.equal(OP_TEXT, f.op)
      assert.same({ name = "moon", n = 42 }, cjson.decode(f.payload))
      -- the forwarded messages never entered Lua
      assert.equal(0, #srv:stdout_lines("^msg "))
    end)

    it("ws:subscribe(ch, fn) runs fn", function()
      local _, port = start()
      local ws = sub_client(port, "/subfn?ch=f")
      publish(port, "f", "one")
      assert.equal("fn:one", assert(ws:message()).payload)
      assert.equal(200, (http_get(port, "/pubtable?ch=f")))
      local p = assert(ws:message()).payload
      assert.same({ name = "moon", n = 42 }, cjson.decode(p:sub(4)))
    end)

    it("with -w 2, clients on both workers get every message in order", function()
      local srv, port = start(nil, { workers = 2 })
      local clients, n = on_both_workers(function() return sub_client(port, "/sub?ch=ordered") end)
      assert.equal(2, n, "clients did not reach two workers: " .. srv:describe())
      probe_then_sequence(port, "ordered", clients, 50, function(ws, timeout)
        local f, err = ws:message(timeout)
        return f and f.payload, err
      end, "client")
      assert_clean_log(srv)
    end)

    it("the subscription ends with the connection; publishing afterwards is harmless", function()
      local srv, port = start()
      local a = sub_client(port, "/sub?ch=gone")
      local b = sub_client(port, "/subfn?ch=gone")
      local keep = sub_client(port, "/sub?ch=gone")
      a:send(close_frame(1000))
      a:expect_close(1000)
      b.c:close()
      wait_close_line(srv, last_open_id(srv, "/subfn"))
      for i = 1, 5 do publish(port, "gone", "after " .. i) end
      for i = 1, 5 do assert.equal("after " .. i, assert(keep:message()).payload) end
      assert_clean_log(srv)
      assert.equal(0, srv:stop())
    end)

    it("a client that never reads is disconnected at max_queue; the others keep receiving", function()
      -- room for 16 messages: the fast client may lag a little
      local srv, port = start { "max_queue=1048576" }
      local slow = ws_connect(port, "/sub?ch=flood", { connect = { rcvbuf = 4096 } })
      local fast = sub_client(port, "/sub?ch=flood")
      -- 10 MiB: more than the kernel's socket buffers hold (about 4 MiB),
      -- in rounds of 512 KiB, each published once the fast client read the
      -- last: it never has more than half of max_queue queued, however
      -- slowly it gets to read (a burst it had to keep up with cut it
      -- under load)
      local batch, rounds, size = 8, 20, 65536
      local n = batch * rounds
      for r = 0, rounds - 1 do
        assert.equal(200, (http_get(port, ("/pubmany?ch=flood&n=%d&size=%d&from=%d"):format(batch, size,
          r * batch + 1))))
        for k = 1, batch do
          local i = r * batch + k
          local f, err = fast:message(H.T(5))
          assert.truthy(f, ("fast client: message %d: %s"):format(i, tostring(err)))
          assert.equal(size, #f.payload)
          assert.equal(i .. ":", f.payload:match("^%d+:"))
        end
      end
      -- the slow one was cut: its connection ends (after what was in flight)
      local data, how = H.read_to_eof(slow.c, H.T(5))
      assert.truthy(data, "slow client still connected: " .. tostring(how) .. "\n" .. srv:describe())
      assert.is_true(#data < n * size, "the slow client got every message")
      local code = wait_close_line(srv, slow.id)
      assert.equal(1006, code)
      assert.is_true(srv:alive())
    end)
  end)

  describe("fan-out of shared frames", function()
    -- Reads every client in turn (a slow reader of one would make the
    -- server queue to the others) until each has `n` messages, checked by
    -- check(client index, k, payload).
    local function read_round_robin(clients, n, check)
      local got, deadline = {}, H.now() + H.T(20)
      for i = 1, #clients do got[i] = 0 end
      while true do
        local done = true
        for i, c in ipairs(clients) do
          local stop = math.min(n, got[i] + 16) -- a few each, in turn
          while got[i] < stop do
            local f = c:message(0.005)
            if not f then break end
            got[i] = got[i] + 1
            check(i, got[i], f.payload)
          end
          done = done and got[i] == n
        end
        if done then return got end
        assert.is_true(H.now() < deadline, "clients got " .. table.concat(got, ","))
      end
    end

    for _, inflight in ipairs { 1, 16 } do
      it(("with -w 2, every client gets every message once and in order, %d in flight"):format(inflight), function()
        local srv, port = start(nil, { workers = 2 })
        local clients, nw = on_both_workers(function() return sub_client(port, "/sub?ch=fan") end)
        assert.equal(2, nw, "clients did not reach two workers: " .. srv:describe())
        for _ = 1, 6 do clients[#clients + 1] = sub_client(port, "/sub?ch=fan") end
        -- every worker knows every subscription once each client had a probe
        probe_then_sequence(port, "fan", clients, 1, function(ws, timeout)
          local f, err = ws:message(timeout)
          return f and f.payload, err
        end, "client")
        local rounds = inflight == 1 and 40 or 12
        local total = 0
        for r = 0, rounds - 1 do
          assert.equal(200, (http_get(port, ("/pubrange?ch=fan&from=%d&n=%d"):format(r * inflight + 1, inflight))))
          total = total + inflight
          read_round_robin(clients, inflight, function(i, k, payload)
            assert.equal("seq " .. (r * inflight + k), payload, "client " .. i)
          end)
        end
        -- nothing more (no duplicates) is on its way
        assert.equal(200, (http_get(port, "/pub?ch=fan&msg=end")))
        for i, c in ipairs(clients) do
          assert.equal("end", assert(c:message(H.T(5))).payload, "client " .. i)
        end
        assert.equal(rounds * inflight, total)
        assert_clean_log(srv)
      end)
    end

    it("a slow subscriber is cut at max_queue while three others lose nothing", function()
      local srv, port = start { "max_queue=1048576" }
      local slow = ws_connect(port, "/sub?ch=many", { connect = { rcvbuf = 4096 } })
      local fast = {}
      for i = 1, 3 do fast[i] = sub_client(port, "/sub?ch=many") end
      -- 10 MiB of 8 KiB messages, more than the kernel buffers the slow
      -- client's socket with, in rounds of 256 KiB: the next round is
      -- published once the fast clients read the last one, so they never
      -- have more than a quarter of max_queue queued however slowly this
      -- machine lets them read (a burst they had to keep up with cut them
      -- on a loaded one)
      local batch, rounds, size = 32, 40, 8192
      for r = 0, rounds - 1 do
        assert.equal(200, (http_get(port, ("/pubmany?ch=many&n=%d&size=%d&from=%d"):format(batch, size, r * batch + 1))))
        read_round_robin(fast, batch, function(i, k, payload)
          assert.equal(size, #payload)
          assert.equal((r * batch + k) .. ":", payload:match("^%d+:"), "fast client " .. i)
        end)
      end
      local n = batch * rounds
      local data, how = H.read_to_eof(slow.c, H.T(5))
      assert.truthy(data, "slow client still connected: " .. tostring(how) .. "\n" .. srv:describe())
      assert.is_true(#data < n * size, "the slow client got every message")
      assert.equal(1006, (wait_close_line(srv, slow.id)))
      assert.is_true(srv:alive())
    end)

    it("a subscriber closing with frames queued frees its references; the others get everything", function()
      local srv, port = start()
      local quitter = ws_connect(port, "/sub?ch=mid", { connect = { rcvbuf = 4096 } })
      local fast = {}
      for i = 1, 2 do fast[i] = sub_client(port, "/sub?ch=mid") end
      local n, size = 600, 4096
      assert.equal(200, (http_get(port, ("/pubmany?ch=mid&n=%d&size=%d&ms=1"):format(n, size))))
      read_round_robin(fast, n / 2, function(i, k, payload)
        assert.equal(k .. ":", payload:match("^%d+:"), "fast client " .. i)
      end)
      -- unread bytes in its socket: the close is a reset, mid-write for
      -- the server, whose queue to it still holds shared frames
      quitter.c:close()
      read_round_robin(fast, n / 2, function(i, k, payload)
        assert.equal((n / 2 + k) .. ":", payload:match("^%d+:"), "fast client " .. i)
      end)
      srv:wait_stdout("pubmany done", H.T(5), true)
      wait_close_line(srv, quitter.id)
      assert.equal(200, (http_get(port, "/pub?ch=mid&msg=after")))
      for i, c in ipairs(fast) do assert.equal("after", assert(c:message(H.T(5))).payload, "fast " .. i) end
      assert.is_true(srv:alive())
      assert.equal(0, srv:stop())
    end)
  end)

  describe("idle connections", function()
    it("an idle client is pinged, and closed when it stays silent", function()
      local srv, port = start { "timeout=1" }
      local ws = ws_connect(port, "/echo")
      local t0 = H.now()
      local f = assert(ws:frame(H.T(3)))
      local t1 = H.now()
      assert.equal(OP_PING, f.op)
      assert.is_true(t1 - t0 > 0.7, ("pinged after %.2f s"):format(t1 - t0))
      local data, how = H.read_to_eof(ws.c, H.T(3) + 1)
      local t2 = H.now()
      assert.truthy(data, "not closed: " .. tostring(how))
      assert.is_true(t2 - t1 > 0.7, ("closed %.2f s after the ping"):format(t2 - t1))
      assert.is_true(t2 - t1 < H.T(2) + 1, ("closed %.2f s after the ping"):format(t2 - t1))
      wait_close_line(srv, last_open_id(srv, "/echo"))
    end)

    it("a client that answers pings with pongs stays open", function()
      -- The server checks idleness once a second, so with timeout = 1 a
      -- silent client is closed 1-2 s after its ping. This one answers and
      -- must still be served 2.6 s after the first ping.
      local _, port = start { "timeout=1" }
      local ws = ws_connect(port, "/echo")
      local first = assert(ws:frame(H.T(3)))
      assert.equal(OP_PING, first.op)
      ws:send(frame(OP_PONG, first.payload))
      local pings, deadline = 1, H.now() + 2.6
      while H.now() < deadline do
        local f, err = ws:frame(math.max(0.01, deadline - H.now()))
        if f then
          assert.equal(OP_PING, f.op)
          pings = pings + 1
          ws:send(frame(OP_PONG, f.payload))
        else
          assert.equal("timeout", err)
        end
      end
      assert.equal("alive", (ws:echo("alive")))
    end)

  end)

  describe("shutdown", function()
    it("SIGTERM sends every client a close frame with 1001", function()
      local srv, port = start()
      local a = ws_connect(port, "/echo")
      local b = ws_connect(port, "/sleep")
      assert.equal("x", (a:echo("x")))
      assert.equal("y", (b:echo("y")))
      local ffi_kill = ffi.C.kill
      ffi_kill(srv:pid(), H.SIGTERM)
      for _, ws in ipairs { a, b } do
        local f = assert(ws:message(H.T(5)))
        assert.equal(OP_CLOSE, f.op)
        assert.equal(1001, f.code)
        ws:send(close_frame(1001))
        ws:expect_eof()
      end
      assert.equal(0, (srv:wait_exit(H.T(10))))
      assert.equal(2, #srv:stdout_lines("^close %S+ %S+ 1001"))
    end)
  end)
end)

---------------------------------------------------------------------------
-- Server-Sent Events
---------------------------------------------------------------------------

local SSE = {}
SSE.__index = SSE

local function sse_connect(port, target, headers)
  local c = H.connect(port)
  local req = ("GET %s HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"):format(target)
  for _, h in ipairs(headers or {}) do req = req .. h .. "\r\n" end
  assert(H.send(c, req .. "\r\n"))
  local r, rest = read_head(c)
  return setmetatable({ c = c, buf = rest, resp = r }, SSE)
end

--- The next event block's text (without the blank line ending it).
function SSE:block(timeout)
  return read_until_taken(self, timeout, function(buf)
    local at = buf:find("\n\n", 1, true)
    if at then return buf:sub(1, at - 1), buf:sub(at + 2) end
  end)
end

--- The next event: { event =, id =, data = (lines joined with "\n"), lines = }.
function SSE:event(timeout)
  while true do
    local b, err = self:block(timeout)
    if not b then return nil, err end
    local ev = { lines = H.lines(b), data_lines = {} }
    for _, l in ipairs(ev.lines) do
      local k, v = l:match("^([^:]*): ?(.*)$")
      if k == "data" then ev.data_lines[#ev.data_lines + 1] = v
      elseif k == "event" then ev.event = v
      elseif k == "id" then ev.id = v end
    end
    if #ev.data_lines > 0 then
      ev.data = table.concat(ev.data_lines, "\n")
      return ev
    end
    self.comments = (self.comments or 0) + 1
  end
end

describe("Server-Sent Events", function()
  after_each(cleanup)

  it("res:sse answers 200 text/event-stream without a length; events carry event, id and data lines; on_open runs after the handler", function()
    local srv, port = start()
    local s = sse_connect(port, "/sse")
    local h = s.resp.headers
    assert.equal(200, s.resp.status, s.resp.head)
    assert.equal("text/event-stream", h["content-type"])
    assert.equal("no-cache", h["cache-control"])
    assert.equal("yes", h["x-sse"])
    assert.is_nil(h["content-length"])
    assert.is_nil(h["transfer-encoding"])
    local e1 = assert(s:event())
    assert.same({ "event: greeting", "id: 7", "data: line one", "data: line two",
      "data: line three" }, e1.lines)
    local e2 = assert(s:event())
    assert.equal("last", e2.event)
    assert.equal("nil nil", e2.data)
    local e3 = assert(s:event())
    assert.equal("opened", e3.data)
    local id = srv:stdout_lines("^sse%-handler%-done ")[1]:match("done (%S+)")
    local lines = srv:stdout_lines("^sse%-")
    assert.same({ "sse-handler-done " .. id, "sse-open " .. id }, lines)
  end)

  it("Last-Event-ID reaches sse:last_event_id()", function()
    local _, port = start()
    local s = sse_connect(port, "/sse", { "Last-Event-ID: 41" })
    assert(s:event())
    local e = assert(s:event())
    assert.equal("41 41", e.data)
  end)

  it("on_close runs when the client goes away", function()
    local srv, port = start()
    local s = sse_connect(port, "/sse")
    for _ = 1, 3 do assert(s:event()) end
    local id = srv:stdout_lines("^sse%-open ")[1]:match("open (%S+)")
    s.c:close()
    srv:wait_stdout("sse-close " .. id, H.T(5), true)
  end)

  it("sse:close() ends the stream; sse:send then fails", function()
    local srv, port = start()
    local s = sse_connect(port, "/sse_close")
    assert.equal(200, s.resp.status)
    local data = s.buf .. assert(H.read_to_eof(s.c))
    assert.equal("data: bye\n\n", data)
    srv:wait_stdout("sse-after-close", H.T(5), true)   -- printed after the close
    assert.same({ "sse-after-close nil closed false" }, srv:stdout_lines("^sse%-after%-close"))
  end)

  it("an idle stream gets a ':' comment every timeout", function()
    local _, port = start { "timeout=1" }
    local s = sse_connect(port, "/sse")
    for _ = 1, 3 do assert(s:event()) end
    local t0 = H.now()
    local b = assert(s:block(H.T(3)))
    local dt = H.now() - t0
    assert.equal(":", b)
    assert.is_true(dt > 0.7, ("comment after %.2f s"):format(dt))
    b = assert(s:block(H.T(3)))
    assert.equal(":", b)
  end)

  it("sse:subscribe(ch) forwards each message as a data event, with -w 2 on both workers", function()
    local srv, port = start(nil, { workers = 2 })
    local clients, npids = on_both_workers(function()
      local s = sse_connect(port, "/sse_sub?ch=ev")
      local e = assert(s:event())
      s.pid = tonumber(e.data:match("pid=(%d+)"))
      return s
    end)
    assert.equal(2, npids, "streams did not reach two workers")
    probe_then_sequence(port, "ev", clients, 30, function(s, timeout)
      local e, err = s:event(timeout)
      return e and e.data, err
    end, "stream")
    -- (another request may reach the other worker: order only after the above)
    publish(port, "ev", "two\nlines")
    for i, s in ipairs(clients) do
      local e
      repeat e = assert(s:event(H.T(5))) until e.data ~= "probe"
      assert.same({ "data: two", "data: lines" }, e.lines, "stream " .. i)
    end
    assert_clean_log(srv)
  end)
end)
