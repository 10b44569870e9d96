-- SPDX-License-Identifier: MIT
-- Client of scripts/bench-idle (LuaJIT + lua-socket): opens N connections
-- of one kind to a server, has each do one exchange, keeps them all open
-- and idle, and prints the growth of the server's RSS per connection.
-- usage: luajit bench/idle_client.lua KIND PORT N PID [PUB_PORT]
--   KIND tcp   each sends "x" and reads it back
--        http  each sends one GET / (keep-alive) and reads the answer
--        ws    each upgrades (the server subscribes it); then, with
--              PUB_PORT, one message is published and every connection
--              reads it, and the RSS is measured again
--        wsz   the same with permessage-deflate offered (as a browser
--              does); the message arrives deflated (RSV1 checked)
-- Prints "KIND bytes_per_connection [after_message_bytes_per_connection]".
local socket = require "socket"

local kind, port, n, pid, pub_port = arg[1], tonumber(arg[2]), tonumber(arg[3]), arg[4], tonumber(arg[5])

local function rss_kb()
  local f = assert(io.open("/proc/" .. pid .. "/status"))
  local s = f:read("*a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)"))
end

local function connect()
  local c = assert(socket.tcp())
  c:settimeout(10)
  assert(c:connect("127.0.0.1", port))
  return c
end

local function read_until(c, want)
  local buf = ""
  while not buf:find(want, 1, true) do
    local d, err, part = c:receive(1)
    d = d or part
    if not d or #d == 0 then error("read: " .. tostring(err)) end
    buf = buf .. d
  end
  return buf
end

socket.sleep(0.3)
local base = rss_kb()
local conns = {}
for i = 1, n do
  local c = connect()
  if kind == "tcp" then
    assert(c:send("x"))
    assert(c:receive(1) == "x")
  elseif kind == "http" then
    assert(c:send("GET / HTTP/1.1\r\nHost: b\r\n\r\n"))
    read_until(c, "Hello World")
  elseif kind == "ws" or kind == "wsz" then
    assert(c:send("GET /ws HTTP/1.1\r\nHost: b\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      .. (kind == "wsz" and "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n" or "")
      .. "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"))
    local head = read_until(c, "\r\n\r\n")
    if kind == "wsz" then assert(head:lower():find("permessage-deflate", 1, true), "not agreed") end
  end
  conns[i] = c
end
socket.sleep(1.5)
local idle = (rss_kb() - base) * 1024 / n
local after
if (kind == "ws" or kind == "wsz") and pub_port then
  local p = assert(socket.tcp())
  assert(p:connect("127.0.0.1", pub_port))
  assert(p:send("GET /pub HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n"))
  p:receive("*a")
  p:close()
  for _, c in ipairs(conns) do
    if kind == "wsz" then -- one deflated frame: RSV1, a short length
      local h = assert(c:receive(2))
      assert(h:byte(1) >= 0xC0, "not deflated")
      assert(c:receive(h:byte(2) % 128))
    else
      read_until(c, "tick")
    end
  end
  socket.sleep(1.5)
  after = (rss_kb() - base) * 1024 / n
end
print(("%s %.0f%s"):format(kind, idle, after and (" %.0f"):format(after) or ""))
for _, c in ipairs(conns) do c:close() end
