-- SPDX-License-Identifier: MIT
-- scripts/bench-pg's moonport app: moonport bench/pg.lua PORT URL POOL
--   /one     SELECT one row by a random id
--   /five    five such SELECTs at once (db:pipeline: one round trip)
--   /insert  INSERT ... RETURNING id
local mp = require "moonport"
local port, url, pool = tonumber(mp.args[1]), mp.args[2], tonumber(mp.args[3] or "8")
local db = mp.pg(url, { pool = pool })
local random = math.random
local ONE = "SELECT id, n, name FROM bench_t WHERE id = $1"

mp.http {
  port = port,
  on_request = function(req, res)
    local p = req.path
    if p == "/one" then
      local r = assert(db:query(ONE, random(1, 100000)))
      return res:json(r[1])
    elseif p == "/five" then
      local rs = db:pipeline {
        { ONE, random(1, 100000) }, { ONE, random(1, 100000) }, { ONE, random(1, 100000) },
        { ONE, random(1, 100000) }, { ONE, random(1, 100000) },
      }
      return res:json({ rs[1][1], rs[2][1], rs[3][1], rs[4][1], rs[5][1] })
    elseif p == "/insert" then
      local r = assert(db:query("INSERT INTO bench_log (n, note) VALUES ($1, $2) RETURNING id",
        random(1, 1000000), "bench"))
      return res:json({ id = r[1].id })
    end
    res:status(404):send("no")
  end,
}
