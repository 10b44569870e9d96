-- scripts/bench-router's server: `moonport bench/router.lua PORT MODE`.
-- MODE "plain": one handler answers every request ("Hello World").
-- MODE "router": mp.router with 50 routes on 10 resources (GET and POST
-- /api/v1/resN, GET and DELETE /api/v1/resN/:id, GET
-- /api/v1/resN/:id/items/:item), every handler answering the same.
local mp = require "moonport"
local port, mode = tonumber(arg[1]), arg[2]

local function hello(_, res) res:send("Hello World") end

local handler = hello
if mode == "router" then
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
  handler = r
end

mp.http { port = port, on_request = handler }
