-- SPDX-License-Identifier: MIT
-- scripts/bench-compress's WebSocket server: subscribers of channel "z"
-- (ws:subscribe from C) get 1 KiB JSON messages, deflated once per
-- message (permessage-deflate without server context takeover) or, with
-- "off", plain.
-- Usage: moonport -w 1 -t 1 bench/fanout_z.lua [off] PORT
--   WebSocket /sub: subscribes, then "ready"
--   GET /pub?i=I: publishes message I (about 1 KiB of JSON)
local mp = require "moonport"

local function json_of(i)
  local items = {}
  for k = 1, 16 do
    items[k] = ('{"id":%d,"user":"u%d","text":"hello there, how are you"}'):format(k, (i + k) % 13)
  end
  return ('{"i":%d,"items":[%s]}'):format(i, table.concat(items, ","))
end

mp.http {
  port = tonumber(mp.args[#mp.args]),
  address = "127.0.0.1",
  on_request = function(req, res)
    mp.publish("z", json_of(tonumber(req.form.i) or 0))
    res:send("ok")
  end,
  websocket = {
    compress = mp.args[1] ~= "off" or nil,
    on_open = function(ws)
      ws:subscribe("z")
      ws:send("ready")
    end,
  },
}
