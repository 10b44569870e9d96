-- SPDX-License-Identifier: MIT
-- scripts/bench-pg's NOTIFY fan-out app (load generator: bench/pubsub_load.c
-- -W /ws, as for scripts/bench-fanout).
-- usage: moonport -w 1 bench/pg_fanout.lua PORT URL
-- One WebSocket text message per command:
--   "sub\n"        ws:subscribe("pg.room") without a function (frames from
--                  C); replies "ok W L\n" once it is in place
--   "pub <text>\n" SELECT pg_notify('room', '<text>\n'): Postgres sends it
--                  to the server's one LISTEN connection (the root's), whose
--                  db:listen(..., { publish = "pg.room" }) hands it to
--                  every worker's subscribers
--   "who\n"        replies "me W L\n"
local mp = require "moonport"

local db = mp.pg(mp.args[2], { pool = 2 })
assert(db:listen("room", { publish = "pg.room" }))
local byte, sub = string.byte, string.sub

mp.http {
  port = tonumber(mp.args[1]),
  address = "127.0.0.1",
  timeout = 0,
  websocket = {
    on_message = function(ws, data)
      if byte(data, 1) == 112 and sub(data, 1, 4) == "pub " then -- 'p'
        local ok, err = db:query("SELECT pg_notify('room', $1)", sub(data, 5))
        if not ok then mp.log("error", "pg_notify: " .. tostring(err)) end
      elseif data == "sub\n" then
        if not ws.env.sub then ws.env.sub = ws:subscribe("pg.room") end
        ws:send(("ok %d %d\n"):format(mp.worker(), mp.lane()))
      elseif data == "who\n" then
        ws:send(("me %d %d\n"):format(mp.worker(), mp.lane()))
      else
        ws:close()
      end
    end,
  },
}
