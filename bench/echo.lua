-- SPDX-License-Identifier: MIT
-- Echo server for the benchmark harness (scripts/bench-echo), used only
-- while examples/echo.lua does not exist yet.
-- usage: moonport -t 1 bench/echo.lua [port]   (port defaults to 3000)
local mp = require "moonport"

mp.listen {
  port = tonumber(mp.args[1]) or 3000,
  address = "127.0.0.1",
  on_data = function(conn, data)
    conn:write(data)
  end,
}
