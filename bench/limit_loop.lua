-- SPDX-License-Identifier: MIT
-- The loop of scripts/bench-limit: n rate-limit decisions over 1,000 keys
-- (1000 r/s, burst 100 each, so most keys are over their budget and most
-- decisions say no, as under an attack), visited in a fixed order that
-- jumps around. moonport runs lim:take (mp.limit: one locked step of the
-- dictionary); nginx + Lua runs the same GCRA written over ngx.shared as
-- lua-resty-limit-traffic's resty.limit.req does it (a get, then a set
-- when the request passes; not atomic across workers, which that library
-- accepts).
local M = {}
M.NKEYS = 1000

function M.keys()
  local k = {}
  for i = 1, M.NKEYS do k[i] = "client:" .. i end
  return k
end

function M.run(take, keys, n)
  local passed, j, nk = 0, 1, M.NKEYS
  for _ = 1, n do
    j = j + 617
    if j > nk then j = j - nk end
    if take(keys[j]) then passed = passed + 1 end
  end
  return passed
end

-- GCRA over ngx.shared: times in ms (ngx.now() is the loop's cached clock,
-- as resty.limit.req uses it).
function M.ngx_take(d, interval, tolerance)
  local now_f = ngx.now
  return function(key)
    local now = now_f() * 1000
    local tat = d:get(key)
    if not tat or tat < now then tat = now end
    local nxt = tat + interval
    if nxt - now > tolerance + interval then return false end
    d:set(key, nxt, (nxt - now) / 1000)
    return true
  end
end

function M.nginx(d, n, workers)
  local keys = M.keys()
  local take = M.ngx_take(d, 1, 100)
  d:incr("ready", 1, 0)
  while d:get("ready") < workers do ngx.sleep(0.001) end
  ngx.update_time()
  local t0, c0 = ngx.now(), os.clock()
  local passed = M.run(take, keys, n)
  local c1 = os.clock()
  ngx.update_time()
  ngx.log(ngx.WARN, ("result %d %d %.4f %.4f %d"):format(ngx.worker.pid(), n,
    ngx.now() - t0, c1 - c0, passed))
end

return M
