-- SPDX-License-Identifier: MIT
-- HTTP/2 server for scripts/bench-h2.
-- usage: moonport -w 1 -t 1 bench/h2.lua PORT CERT KEY H2C_PORT
--   PORT      mp.http over TLS (ALPN h2)
--   H2C_PORT  the same handler over cleartext h2 (h2c = true)
--   anything -> "Hello World" (text/plain), as bench/http.lua
local mp = require "moonport"

local port, cert, key, h2c_port = tonumber(mp.args[1]), mp.args[2], mp.args[3], tonumber(mp.args[4])
assert(port and cert and key and h2c_port, "usage: bench/h2.lua PORT CERT KEY H2C_PORT")

local function on_request(_, res) res:send("Hello World") end

-- 1,000 connections that open at once on a busy 2-core machine take more
-- than the default 10 s to send their first request
mp.http { port = port, address = "127.0.0.1", tls = { cert = cert, key = key },
          header_timeout = 60, on_request = on_request }
mp.http { port = h2c_port, address = "127.0.0.1", h2c = true, header_timeout = 60,
          on_request = on_request }
