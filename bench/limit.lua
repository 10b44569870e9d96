-- SPDX-License-Identifier: MIT
-- scripts/bench-limit's moonport side: moonport -w 2 -t 1 bench/limit.lua OPS
-- Each worker waits for the other on the dictionary, then makes OPS
-- decisions with lim:take (bench/limit_loop.lua) and prints
-- "result <pid> <ops> <wall s> <cpu s> <passed>".
package.path = "bench/?.lua;" .. package.path
local mp = require "moonport"
local L = require "limit_loop"
local ops = tonumber(mp.args[1] or "1000000")
local d = mp.shared("limits", { size = "16m" })
local lim = mp.limit { dict = "limits", rate = "1000r/s", burst = 100 }

if not mp.is_root() then
  mp.on("start", function()
    local keys = L.keys()
    local function take(k) return lim:take(k) end
    d:incr("ready", 1, 0)
    local t
    t = mp.every(1, function()
      if d:get("ready") < mp.workers() then return end
      t:stop()
      local t0, c0 = mp.now(), os.clock()
      local passed = L.run(take, keys, ops)
      local c1, t1 = os.clock(), mp.now()
      io.write(("result %d %d %.4f %.4f %d\n"):format(mp.pid(), ops, (t1 - t0) / 1000, c1 - c0, passed))
      io.flush()
    end)
  end)
end
