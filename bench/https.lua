-- SPDX-License-Identifier: MIT
-- HTTPS server for scripts/bench-tls (and scripts/bench-tls-idle).
-- usage: moonport -w 1 -t 1 bench/https.lua PORT CERT KEY [PLAIN_PORT]
--   PORT        mp.http over TLS (tls = {cert = CERT, key = KEY})
--   PLAIN_PORT  (optional) the same handler without TLS: bench-tls-idle
--               compares idle plain and idle TLS connections on one server
--   GET /json -> {"message":"Hello, World!","n":1,"ok":true} (application/json, cjson)
--   anything else -> "Hello World" (text/plain), as bench/http.lua
local mp = require "moonport"

local port = tonumber(mp.args[1]) or 3443
local cert, key = mp.args[2], mp.args[3]
local plain_port = tonumber(mp.args[4])
assert(cert and key, "usage: bench/https.lua PORT CERT KEY [PLAIN_PORT]")

local function on_request(req, res)
  if req.path == "/json" then
    return res:json { message = "Hello, World!", n = 1, ok = true }
  end
  res:send("Hello World")
end

mp.http {
  port = port,
  address = "127.0.0.1",
  tls = { cert = cert, key = key },
  -- nginx's client_header_timeout: bench-tls-idle's 10,000 connections that
  -- finish the handshake and never send a request take more than the
  -- default 10 s to open on a busy 2-core machine
  header_timeout = 60,
  on_request = on_request,
}

if plain_port then
  mp.http {
    port = plain_port,
    address = "127.0.0.1",
    on_request = on_request,
  }
end
