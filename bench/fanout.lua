-- SPDX-License-Identifier: MIT
-- WebSocket fan-out server for scripts/bench-fanout (load generator:
-- bench/pubsub_load.c -W /ws; the Node peer is bench/node_fanout.js).
-- usage: moonport -w 1 bench/fanout.lua [port [channel]]
--        (port defaults to 3003, channel to "room")
--
-- One WebSocket text message per command:
--   "sub\n"        ws:subscribe(channel) without a function: every message
--                  published there goes to the client as a frame from C.
--                  Replies "ok W L\n" (worker, lane) once it is in place.
--   "pub <text>\n" mp.publish(channel, "<text>\n") (cluster scope).
--   "who\n"        replies "me W L\n".
-- Anything else closes the connection.
local mp = require "moonport"

local channel = mp.args[2] or "room"
local publish = mp.publish
local byte, sub = string.byte, string.sub

mp.http {
  port = tonumber(mp.args[1]) or 3003,
  address = "127.0.0.1",
  timeout = 0,
  websocket = {
    on_message = function(ws, data)
      if byte(data, 1) == 112 and sub(data, 1, 4) == "pub " then -- 'p'
        publish(channel, sub(data, 5))
      elseif data == "sub\n" then
        if not ws.env.sub then ws.env.sub = ws:subscribe(channel) end
        ws:send(("ok %d %d\n"):format(mp.worker(), mp.lane()))
      elseif data == "who\n" then
        ws:send(("me %d %d\n"):format(mp.worker(), mp.lane()))
      else
        ws:close()
      end
    end,
  },
}
