-- scripts/bench-proxy's moonport server: every request is fetched from the
-- upstream with mp.fetch (its per-lane keep-alive pool) and its body sent
-- back. usage: moonport -w 1 -t 1 bench/proxy.lua PORT UPSTREAM_PORT
local mp = require "moonport"
local port, up = tonumber(mp.args[1]), tonumber(mp.args[2])
local url = "http://127.0.0.1:" .. up .. "/"

mp.http {
  port = port, address = "127.0.0.1",
  on_request = function(_, res)
    local r, err = mp.fetch(url, { timeout = 5000 })
    if not r then return res:status(502):send(err) end
    res:status(r.status):send(r.body)
  end,
}
