-- SPDX-License-Identifier: MIT
-- bench-proxy's moonport up:proxy row: every request goes through
-- mp.upstream to the upstream (C head rewrite and body pump, the lane's
-- keep-alive pool). Usage: moonport bench/proxy_upstream.lua PORT UPSTREAM_PORT[,PORT...]
local mp = require "moonport"
local servers = {}
for p in mp.args[2]:gmatch("%d+") do servers[#servers + 1] = "127.0.0.1:" .. p end
local up = mp.upstream { servers = servers, keepalive = 128, retries = 2 }
mp.http {
  port = tonumber(mp.args[1]),
  on_request = function(req, res) up:proxy(req, res) end,
}
