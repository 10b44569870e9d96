-- Spec: the Lua watchdog (--lua-timeout SEC, MOONPORT_LUA_TIMEOUT; default
-- 30, 0: off). A worker's main thread checks its lanes about once a
-- second; a callback running longer than the timeout makes the root
-- replace the worker (the new one serves first; the stuck one, which
-- cannot drain, is killed at its drain deadline + grace + 2 s). With one
-- process (-w 1) the watchdog only says so on stderr, once.
local H = require "spec.helper"
local ffi = require "ffi"     -- kill(2) is declared by spec/helper.lua

local children, running = H.children, H.running

local plain, count_lines = H.plain, H.count_lines

local started, tracked = {}, {}

local function cleanup()
  local kids = tracked
  for _, srv in ipairs(started) do
    for _, p in ipairs(children(srv:pid())) do kids[#kids + 1] = p end
  end
  local ok, err = pcall(H.cleanup)     -- SIGKILLs the roots
  -- a worker stuck in Lua cannot notice its root died
  for _, p in ipairs(kids) do
    local cl = H.cmdline(p)
    if running(p) and cl and plain(cl, "watchdog.lua") then ffi.C.kill(p, H.SIGKILL) end
  end
  started, tracked = {}, {}
  if not ok then error(err, 0) end
end

local function start(options, opts)
  opts = opts or {}
  local port = H.free_port()
  local srv = H.start("watchdog.lua", { threads = 1, grace = opts.grace, options = options,
                                        env = opts.env, args = { port }, wait_port = port })
  started[#started + 1] = srv
  return srv, port
end

-- A request on a fresh connection: "<pid> <worker>" -> pid, worker.
local function who(port, timeout)
  timeout = timeout or H.T(3)
  local c, err = H.try_connect(port, { timeout = timeout })
  if not c then return nil, "connect: " .. tostring(err) end
  local ok, e = H.send(c, "who\n", timeout)
  if not ok then c:close() return nil, "send: " .. tostring(e) end
  local l, e2 = H.read_line(c, timeout)
  c:close()
  if not l then return nil, "read: " .. tostring(e2) end
  local pid, w = l:match("^(%d+) (%d+)$")
  if not pid then return nil, "bad reply: " .. l end
  return tonumber(pid), tonumber(w)
end

describe("the Lua watchdog", function()
  after_each(cleanup)

  it("-w 2: a worker stuck in a callback is replaced while the other keeps serving", function()
    local srv, port = start({ "-w", "2", "--lua-timeout", "1", "--drain-timeout", "1" }, { grace = 1 })
    local root = srv:pid()
    H.wait_for(function()
      return #children(root) == 2 and #srv:stdout_lines("^worker_start ") >= 2
    end, H.T(10), function() return "two workers: " .. srv:describe() end)
    local before = children(root)

    -- waiting in mp.sleep longer than the timeout is not running
    local n = H.connect(port)
    assert.is_true(H.send(n, "nap 2000\n"))
    assert.equal("napped", H.read_line(n, H.T(5)))
    n:close()
    assert.falsy(plain(srv:stderr(), "has been running"), srv:stderr())
    assert.same(before, children(root))

    -- a connection whose on_data never returns
    local c = H.connect(port)
    assert.is_true(H.send(c, "who\n"))
    local stuck, w = assert(H.read_line(c, H.T(3))):match("^(%d+) (%d+)$")
    stuck, w = tonumber(stuck), tonumber(w)
    assert.is_true(H.send(c, "spin\n"))
    local t0 = H.now()
    H.sleep(0.2)   -- it is spinning now, accepting nothing

    -- every request on a fresh connection is answered, by a live worker
    local served, failed, by = 0, {}, {}
    H.wait_for(function()
      local pid, e = who(port, H.T(6))
      if pid then
        served = served + 1
        by[pid] = (by[pid] or 0) + 1
        assert.are_not.equal(stuck, pid, "the stuck worker answered")
      else
        failed[#failed + 1] = ("%.2fs: %s"):format(H.now() - t0, tostring(e))
      end
      local kids = children(root)
      return not running(stuck) and #kids == 2 and by[kids[1]] and by[kids[2]]
    end, H.T(15), function()
      return ("the stuck worker (pid %d) gone and two workers serving (children %s): %s")
        :format(stuck, table.concat(children(root), ","), srv:describe())
    end, 0.02)
    assert.same({}, failed)
    local gone = H.now() - t0
    assert.is_true(gone < H.T(10), ("the stuck worker took %.1fs to go"):format(gone))

    -- the log says who was stuck, where and in what
    local err = srv:stderr()
    local line
    for _, l in ipairs(H.lines(err)) do
      if plain(l, "(pid " .. stuck .. "): lane 1 has been running") then
        assert.is_nil(line, "logged twice:\n" .. err)
        line = l
      end
    end
    assert.truthy(line, err)
    assert.truthy(line:find("^moonport: worker " .. w .. " %(pid " .. stuck
      .. "%): lane 1 has been running on_data for %d+%.%d s %(over %-%-lua%-timeout%); starting its replacement$"), line)
    local secs = tonumber(line:match("for (%d+%.%d) s"))
    assert.is_true(secs >= 1 and secs < H.T(3), line)
    -- it could not drain, so it was killed
    assert.truthy(plain(err, "(pid " .. stuck .. "), replaced, did not finish in time; killing it"), err)

    -- its connection is gone; the server goes on with two workers
    local _, e = H.read_to_eof(c, H.T(3))
    assert.are_not.equal("timeout", e)
    local kids = children(root)
    assert.equal(2, #kids)
    for _, k in ipairs(kids) do assert.are_not.equal(stuck, k) end
    assert.truthy(who(port))
    assert.equal(0, srv:stop())
  end)

  it("a worker stuck in a callback still exits when its root dies", function()
    -- (docs/API.md: if the root dies, each worker stops within a second)
    local srv, port = start({ "-w", "2", "--lua-timeout", "0" }, { grace = 1 })
    local root = srv:pid()
    H.wait_for(function()
      return #children(root) == 2 and #srv:stdout_lines("^worker_start ") >= 2
    end, H.T(10), function() return "two workers: " .. srv:describe() end)
    local kids = children(root)
    for _, k in ipairs(kids) do tracked[#tracked + 1] = k end
    local c = H.connect(port)
    assert.is_true(H.send(c, "who\n"))
    local stuck = tonumber(assert(H.read_line(c, H.T(3))):match("^(%d+) %d+$"))
    assert.is_true(H.send(c, "spin\n"))
    H.sleep(0.3)
    srv:kill(H.SIGKILL)
    assert.is_not_nil(srv:wait_exit(H.T(3)))
    local ok = pcall(H.wait_for, function()
      return not running(kids[1]) and not running(kids[2])
    end, H.T(4), "workers to exit")
    local left = {}
    for _, k in ipairs(kids) do
      if running(k) then left[#left + 1] = ("pid %d%s"):format(k, k == stuck and " (the stuck one)" or "") end
    end
    assert.is_true(ok, ("%.0fs after the root died, still running: %s; port %d listening: %s\n%s")
      :format(H.T(4), table.concat(left, ", "), port, tostring(H.is_listening(port)), srv:describe()))
    assert.is_false(H.is_listening(port))
  end)

  it("-w 1: it only logs, once; a stuck timer is named too", function()
    local a, pa = start({ "-w", "1", "--lua-timeout", "1" })
    local b, pb = start({ "-w", "1", "--lua-timeout", "1" })
    local ca = H.connect(pa)
    assert.is_true(H.send(ca, "spin\n"))
    local cb = H.connect(pb)
    assert.is_true(H.send(cb, "spin-timer\n"))
    assert.equal("ok", H.read_line(cb, H.T(3)))

    local want_a = "moonport: lane 1 has been running on_data for %d+%.%d s %(over %-%-lua%-timeout%); it serves nothing else until it returns\n"
    local want_b = "moonport: lane 1 has been running timer for %d+%.%d s %(over %-%-lua%-timeout%); it serves nothing else until it returns\n"
    a:wait_stderr(want_a, H.T(4))
    b:wait_stderr(want_b, H.T(4))
    H.sleep(2)
    for _, s in ipairs { a, b } do
      assert.equal(1, count_lines(s:stderr(), "has been running"), s:stderr())
      assert.equal(1, #H.lines(s:stderr()), s:stderr())
      assert.is_true(s:alive())
      assert.same({}, children(s:pid()))
    end
  end)

  it("0 turns it off (the command line wins over MOONPORT_LUA_TIMEOUT); bad values are usage errors", function()
    local off, poff = start({ "-w", "1", "--lua-timeout", "0" }, { env = { MOONPORT_LUA_TIMEOUT = "1" } })
    local on, pon = start({ "-w", "1" }, { env = { MOONPORT_LUA_TIMEOUT = "1" } })
    for _, p in ipairs { poff, pon } do
      assert.is_true(H.send(H.connect(p), "spin\n"))
    end
    on:wait_stderr("lane 1 has been running on_data for", H.T(4), true)
    H.sleep(1.5)
    assert.equal("", off:stderr())
    assert.is_true(off:alive())

    for _, case in ipairs {
      { args = { "--lua-timeout", "abc" }, name = "--lua-timeout" },
      { args = { "--lua-timeout", "-1" }, name = "--lua-timeout" },
      { args = {}, env = { MOONPORT_LUA_TIMEOUT = "soon" }, name = "MOONPORT_LUA_TIMEOUT" },
    } do
      local port = H.free_port()
      local argv = {}
      for _, a in ipairs(case.args) do argv[#argv + 1] = a end
      argv[#argv + 1] = H.fixture("watchdog.lua")
      argv[#argv + 1] = port
      local st, _, err = H.run(argv, { env = case.env })
      assert.equal(2, st, err)
      local l = H.one_line(err)
      assert.truthy(plain(l, case.name), l)
      assert.is_false(H.is_listening(port))
    end
  end)
end)
