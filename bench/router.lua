-- SPDX-License-Identifier: MIT
-- scripts/bench-router's server: `moonport bench/router.lua PORT MODE`.
-- MODE "plain": one handler answers every request ("Hello World").
-- MODE "router": mp.router with 50 routes on 10 resources (GET and POST
-- /api/v1/resN, GET and DELETE /api/v1/resN/:id, GET
-- /api/v1/resN/:id/items/:item), every handler answering the same.
-- MODE "mw3": the same router with three middlewares (r:use) that let
-- every request through: one for all paths, one for "/api", one that
-- reads a header.
local mp = require "moonport"
local port, mode = tonumber(arg[1]), arg[2]

local function hello(_, res) res:send("Hello World") end

local handler = hello
if mode == "router" or mode == "mw3" then
  local r, n = mp.router(), 0
  for i = 1, 10 do
    local base = "/api/v1/res" .. i
    r:get(base, hello)
    r:post(base, hello)
    r:get(base .. "/:id", hello)
    r:delete(base .. "/:id", hello)
    r:get(base .. "/:id/items/:item", hello)
    n = n + 5
  end
  assert(n == 50)
  if mode == "mw3" then
    local seen = 0
    r:use(function() seen = seen + 1 end)
    r:use("/api", function(req) if req.method == "TRACE" then seen = 0 end end)
    r:use(function(req, res) if req.headers["x-block"] then res:status(403):send() end end)
  end
  handler = r
end

mp.http { port = port, on_request = handler }
