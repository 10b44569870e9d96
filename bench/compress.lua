-- SPDX-License-Identifier: MIT
-- scripts/bench-compress's moonport server: a 16 KiB JSON answer gzip'd
-- at level 5, from Lua (GET /json: res:send of a string made at start)
-- and from a file (GET /static/16k.json: the public folder).
-- Usage: moonport -w 1 -t 1 bench/compress.lua PORT DIR [LEVEL [CACHE]]
-- (LEVEL: compress.level, default 5; CACHE: compress.cache in bytes, 0 to
-- compress every file request)
local mp = require "moonport"

local f = assert(io.open(mp.args[2] .. "/static/16k.json", "rb"))
local body = f:read("*a")
f:close()

mp.http {
  port = tonumber(mp.args[1]),
  address = "127.0.0.1",
  public = mp.args[2],
  public_prefix = "/static/",
  compress = { level = tonumber(mp.args[3]) or 5, brotli = false,
               cache = tonumber(mp.args[4]) },
  on_request = function(_, res)
    res:header("Content-Type", "application/json"):send(body)
  end,
}
