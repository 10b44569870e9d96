-- SPDX-License-Identifier: MIT
-- `luajit bench/keepalive_client.lua PORT N PATH`: N sequential keep-alive GETs
-- of PATH on 127.0.0.1:PORT, each answer read whole (scripts/bench-router's
-- instruction counts under callgrind).
local socket = require "socket"
local port, n, path = tonumber(arg[1]), tonumber(arg[2]), arg[3] or "/"
local c
for _ = 1, 200 do
  c = socket.connect("127.0.0.1", port)
  if c then break end
  socket.sleep(0.05)
end
assert(c, "no server")
local req = "GET " .. path .. " HTTP/1.1\r\nHost: x\r\n\r\n"
for i = 1, n do
  assert(c:send(req))
  local len
  while true do
    local l = assert(c:receive("*l"))
    if l == "" then break end
    local v = l:match("^[Cc]ontent%-[Ll]ength: (%d+)")
    if v then len = tonumber(v) end
  end
  if len > 0 then assert(c:receive(len)) end
end
c:close()
