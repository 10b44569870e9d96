-- SPDX-License-Identifier: MIT
-- The loop of scripts/bench-shared, the same code in moonport (bench/shared.lua)
-- and in nginx + Lua (bench/nginx_shared.conf.in): n operations on 10,000
-- keys, 90 % get, 5 % set, 5 % incr (on 100 counters), the keys visited in
-- a fixed order that jumps around (stride 7919, coprime with 10,000).
local M = {}

M.NKEYS = 10000

-- The key and value strings, made once so the loop allocates nothing.
function M.prepare()
  local keys, vals, ctrs = {}, {}, {}
  for i = 1, M.NKEYS do
    keys[i] = "key:" .. i
    vals[i] = "value of key " .. i .. " (some bytes)"
  end
  for i = 1, 100 do ctrs[i] = "ctr:" .. i end
  return keys, vals, ctrs
end

function M.fill(d, keys, vals)
  for i = 1, #keys do assert(d:set(keys[i], vals[i])) end
end

-- Returns how many gets found their key (all of them, after fill).
function M.run(d, keys, vals, ctrs, n)
  local hits, j, nk = 0, 1, M.NKEYS
  for i = 1, n do
    j = j + 7919
    if j > nk then j = j - nk end
    local r = i % 20
    if r == 0 then
      d:set(keys[j], vals[j])
    elseif r == 10 then
      d:incr(ctrs[j % 100 + 1], 1, 0)
    elseif d:get(keys[j]) then
      hits = hits + 1
    end
  end
  return hits
end

-- Single lane: only gets, from a dictionary (d:get) or from a plain Lua
-- table (t[k], what a per-lane cache would cost).
function M.gets(d, keys, n)
  local hits, j, nk = 0, 1, M.NKEYS
  for _ = 1, n do
    j = j + 7919
    if j > nk then j = j - nk end
    if d:get(keys[j]) then hits = hits + 1 end
  end
  return hits
end

function M.table_gets(t, keys, n)
  local hits, j, nk = 0, 1, M.NKEYS
  for _ = 1, n do
    j = j + 7919
    if j > nk then j = j - nk end
    if t[keys[j]] then hits = hits + 1 end
  end
  return hits
end

-- nginx: one worker's run, from a timer started by init_worker_by_lua.
-- Both workers wait for each other on the dictionary, then run; the
-- result goes to the error log: "result <pid> <ops> <wall s> <cpu s> <hits>".
function M.nginx(d, n, workers)
  local keys, vals, ctrs = M.prepare()
  M.fill(d, keys, vals)
  d:incr("ready", 1, 0)
  while d:get("ready") < workers do ngx.sleep(0.001) end
  ngx.update_time()
  local t0, c0 = ngx.now(), os.clock()
  local hits = M.run(d, keys, vals, ctrs, n)
  local c1 = os.clock()
  ngx.update_time()
  ngx.log(ngx.WARN, ("result %d %d %.4f %.4f %d"):format(ngx.worker.pid(), n,
    ngx.now() - t0, c1 - c0, hits))
end

return M
