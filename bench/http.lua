-- HTTP server for the benchmark harness (scripts/bench-http).
-- usage: moonport -w 1 -t 1 bench/http.lua [port]   (port defaults to 3003)
--   GET /json -> {"message":"Hello, World!","n":1,"ok":true} (application/json, cjson)
--   anything else -> "Hello World" (text/plain)
local mp = require "moonport"

mp.http {
  port = tonumber(mp.args[1]) or 3003,
  address = "127.0.0.1",
  on_request = function(req, res)
    if req.path == "/json" then
      return res:json { message = "Hello, World!", n = 1, ok = true }
    end
    res:send("Hello World")
  end,
}
