-- SPDX-License-Identifier: MIT
-- scripts/bench-shared's moonport side. Usage:
--   moonport -w 2 bench/shared.lua multi OPS  each worker runs the loop of
--       bench/shared_loop.lua OPS times once both are ready, and prints
--       "result <pid> <ops> <wall s> <cpu s> <hits>"
--   moonport -w 1 bench/shared.lua single OPS  one lane: OPS gets from a
--       plain Lua table, then from the dictionary; prints
--       "single <table ns/get> <dict ns/get>" and stops
package.path = "bench/?.lua;" .. package.path
local mp = require "moonport"
local L = require "shared_loop"

local mode, ops = mp.args[1], tonumber(mp.args[2] or "2000000")
local d = mp.shared("bench", { size = "16m" })

local function say(...)
  io.write(table.concat({ ... }, " "), "\n")
  io.flush()
end

if mode == "multi" and not mp.is_root() then
  mp.on("start", function()
    local keys, vals, ctrs = L.prepare()
    L.fill(d, keys, vals)
    d:incr("ready", 1, 0)
    local t
    t = mp.every(1, function()
      if d:get("ready") < mp.workers() then return end
      t:stop()
      local t0, c0 = mp.now(), os.clock()
      local hits = L.run(d, keys, vals, ctrs, ops)
      local c1, t1 = os.clock(), mp.now()
      say("result", mp.pid(), ops, ("%.4f"):format((t1 - t0) / 1000),
        ("%.4f"):format(c1 - c0), hits)
    end)
  end)
elseif mode == "single" then
  mp.on("start", function()
    local keys, vals = L.prepare()
    L.fill(d, keys, vals)
    local t = {}
    for i = 1, #keys do t[keys[i]] = vals[i] end
    L.table_gets(t, keys, ops) -- warm up (and JIT) both
    L.gets(d, keys, math.max(1, math.floor(ops / 10)))
    local c0 = os.clock()
    assert(L.table_gets(t, keys, ops) == ops)
    local c1 = os.clock()
    assert(L.gets(d, keys, ops) == ops)
    local c2 = os.clock()
    say("single", ("%.2f"):format((c1 - c0) / ops * 1e9),
      ("%.2f"):format((c2 - c1) / ops * 1e9))
    mp.stop()
  end)
end
