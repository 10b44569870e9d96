-- SPDX-License-Identifier: MIT
-- Server of scripts/bench-idle: what idle connections cost.
-- usage: moonport -w 1 bench/idle.lua PORT
--   PORT       raw TCP echo (mp.listen)
--   PORT + 1   HTTP: GET / -> "Hello World"; GET /pub -> publishes "tick"
--              to channel "room" and answers "ok"; WebSocket upgrades
--              subscribe to "room" on open through the C fast path
local mp = require "moonport"

local port = tonumber(mp.args[1]) or 3010

mp.listen {
  port = port,
  address = "127.0.0.1",
  on_data = function(conn, data) conn:write(data) end,
}

mp.http {
  port = port + 1,
  address = "127.0.0.1",
  on_request = function(req, res)
    if req.path == "/pub" then
      mp.publish("room", "tick")
      return res:send("ok")
    end
    res:send("Hello World")
  end,
  websocket = {
    -- permessage-deflate for the clients that offer it (bench-idle's wsz
    -- row): the defaults, no server context takeover, and "tick" deflated
    compress = { threshold = 0 },
    on_open = function(ws) ws:subscribe("room") end,
  },
}
