-- SPDX-License-Identifier: MIT
-- `luajit bench/keepalive_client.lua PORT N PATH`: N sequential keep-alive GETs
-- of PATH on 127.0.0.1:PORT, each answer read whole, by Content-Length or
-- chunked (scripts/bench-router's and scripts/bench-callgrind's instruction
-- counts under callgrind).
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
  local len, chunked
  while true do
    local l = assert(c:receive("*l"))
    if l == "" then break end
    local v = l:match("^[Cc]ontent%-[Ll]ength: (%d+)")
    if v then len = tonumber(v) end
    if l:lower() == "transfer-encoding: chunked" then chunked = true end
  end
  if chunked then
    while true do
      local size = assert(tonumber(assert(c:receive("*l")), 16))
      if size == 0 then
        assert(c:receive("*l"))
        break
      end
      assert(c:receive(size))
      assert(c:receive("*l"))
    end
  elseif len > 0 then
    assert(c:receive(len))
  end
end
c:close()
