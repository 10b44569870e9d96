-- SPDX-License-Identifier: MIT
-- moonport's side of scripts/bench-upload: a multipart upload streamed to
-- disk with part:save (stream_body, so the body never sits in memory).
-- usage: moonport -w 1 -t 1 bench/upload.lua PORT DIR
local mp = require "moonport"
local port, dir = tonumber(arg[1]), arg[2]

mp.http { port = port, stream_body = true, max_body = 2 ^ 32, header_timeout = 3600,
  on_request = function(req, res)
    local saved = 0
    for part in req:parts() do
      if part.filename then saved = saved + assert(part:save(dir .. "/moonport.bin")) end
    end
    res:send(tostring(saved))
  end }
