-- SPDX-License-Identifier: MIT
-- bench-proxy's moonport row: every request fetches the upstream's body
-- with mp.fetch (the lane's keep-alive pool) and returns it.
-- Usage: moonport bench/proxy.lua PORT UPSTREAM_PORT
local mp = require "moonport"
local up = "http://127.0.0.1:" .. mp.args[2] .. "/"

mp.http {
  port = tonumber(mp.args[1]),
  on_request = function(_, res)
    local r, err = mp.fetch(up, { pool_size = 128 })
    if not r then return res:status(502):send(err) end
    res:header("content-type", "text/plain"):send(r.body)
  end,
}
