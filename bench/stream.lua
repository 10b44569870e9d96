-- SPDX-License-Identifier: MIT
-- A streamed body for scripts/bench-callgrind: every request is answered
-- with four res:write of 16 KiB (chunked), then res:finish().
-- usage: moonport -w 1 -t 1 bench/stream.lua [port]   (default 3004)
local mp = require "moonport"

local piece = string.rep("x", 16384)

mp.http {
  port = tonumber(mp.args[1]) or 3004,
  address = "127.0.0.1",
  on_request = function(_, res)
    for _ = 1, 4 do res:write(piece) end
    res:finish()
  end,
}
