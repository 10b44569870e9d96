-- SPDX-License-Identifier: MIT
-- HTTP server for the benchmark harness (scripts/bench-http).
-- usage: moonport -w 1 -t 1 bench/http.lua [port [public_dir [h2c]]]   (port defaults to 3003)
--   h2c: "h2c" also takes cleartext HTTP/2 (scripts/bench-reload's h2 rows)
--   GET /json -> {"message":"Hello, World!","n":1,"ok":true} (application/json, cjson)
--   a file under public_dir (when given) -> served from C by mp.http's `public`
--     (the benchmark's static endpoint: GET /static/1k.txt)
--   anything else -> "Hello World" (text/plain); `public_prefix = "/static/"`
--     keeps "/" and "/json" away from the folder (no file lookup), as nginx's
--     `location /static/` does
local mp = require "moonport"

local public = mp.args[2]
if public == "" then public = nil end

mp.http {
  port = tonumber(mp.args[1]) or 3003,
  address = "127.0.0.1",
  public = public,
  public_prefix = public and "/static/" or nil,
  h2c = mp.args[3] == "h2c",
  on_request = function(req, res)
    if req.path == "/json" then
      return res:json { message = "Hello, World!", n = 1, ok = true }
    end
    res:send("Hello World")
  end,
}
