-- A TCP echo server: moonport examples/echo.lua [port]
local mp = require "moonport"

local port = tonumber(mp.args[1]) or 3000

mp.listen {
  port = port,
  address = "127.0.0.1",
  on_data = function(conn, data) conn:write(data) end,
}
