-- SPDX-License-Identifier: MIT
-- Echo whose connections each carry Lua state (conn object and conn.env),
-- for measuring memory per idle connection with its Lua side.
local mp = require "moonport"

mp.listen {
  port = tonumber(mp.args[1]) or 3000,
  address = "127.0.0.1",
  timeout = 0,
  on_open = function(conn) conn.env.count = 0 end,
  on_data = function(conn, data)
    conn.env.count = conn.env.count + 1
    conn:write(data)
  end,
}
