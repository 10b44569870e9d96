-- Spec: mp.shared, the dictionary every worker and lane shares. The
-- fixture (spec/fixtures/shared_app.lua) answers line commands on each
-- connection with its dictionaries "main" and "small"; connections are
-- spread over the workers and lanes, and the spec keeps one per
-- (process, lane) it wants to reach.
local H = require "spec.helper"
local ffi = require "ffi"     -- kill(2) is declared by spec/helper.lua

local start, cleanup = H.fixture_servers("shared_app.lua")

local function ask(c, line, timeout)
  assert(H.send(c, line .. "\n", timeout or H.T(5)))
  return assert(H.read_line(c, timeout or H.T(5)))
end

-- Connections until `want` distinct (pid, lane) pairs answered: a list of
-- { c = conn, pid = P, lane = L }.
local function reach(port, want)
  local got, seen = {}, {}
  H.wait_for(function()
    local c = H.connect(port)
    local pid, w, lane = ask(c, "who"):match("^(%d+) (%d+) (%d+)$")
    local key = pid .. "/" .. lane
    if seen[key] then
      c:close()
    else
      seen[key] = true
      got[#got + 1] = { c = c, pid = tonumber(pid), worker = tonumber(w),
                        lane = tonumber(lane) }
    end
    return #got >= want
  end, H.T(10), function() return want .. " lanes reached, got " .. #got end, 0)
  return got
end

local function pids_of(lanes)
  local set, n = {}, 0
  for _, l in ipairs(lanes) do
    if not set[l.pid] then set[l.pid] = true n = n + 1 end
  end
  return n
end

-- Waits until the root has `n` worker children that all serve; returns
-- their pids.
local function wait_workers(srv, port, n, not_pid)
  local kids
  H.wait_for(function()
    kids = H.children(srv:pid())
    if #kids ~= n then return false end
    for _, k in ipairs(kids) do
      if k == not_pid then return false end
      if not H.pid_listens_on(k, port) then return false end
    end
    return true
  end, H.T(10), function() return n .. " workers: " .. srv:describe() end)
  return kids
end

describe("mp.shared", function()
  after_each(cleanup)

  it("a value set on one lane is read on every lane of every worker (-w 2 -t 2)", function()
    local _, port = start({}, { workers = 2, threads = 2 })
    local lanes = reach(port, 4)
    assert.equal(2, pids_of(lanes))
    for i, from in ipairs(lanes) do
      assert.equal("ok false", ask(from.c, ("set main k%d v%d"):format(i, i)))
      for _, to in ipairs(lanes) do
        assert.equal("v" .. i, ask(to.c, "get main k" .. i),
          ("set on %d/%d, read on %d/%d"):format(from.pid, from.lane, to.pid, to.lane))
      end
    end
    -- numbers and booleans keep their type; a missing key is nil
    assert.equal("15", ask(lanes[1].c, "incr main n 5 10"))
    assert.equal("15", ask(lanes[4].c, "get main n"))
    assert.equal("nil", ask(lanes[3].c, "get main nothing"))
    -- add / replace see what the other worker did
    assert.equal("err exists false", ask(lanes[2].c, "add main k1 x"))
    assert.equal("err not found false", ask(lanes[3].c, "replace main zz x"))
    assert.equal("ok", ask(lanes[4].c, "del main k1"))
    assert.equal("nil", ask(lanes[1].c, "get main k1"))
  end)

  it("incr from 4 lanes in each of 2 workers at once adds up exactly", function()
    local _, port = start({}, { workers = 2, threads = 4 })
    local lanes = reach(port, 8)
    assert.equal(2, pids_of(lanes))
    local N = 20000
    for _, l in ipairs(lanes) do assert(H.send(l.c, ("hammer main ctr %d\n"):format(N))) end
    for _, l in ipairs(lanes) do assert.equal("done", assert(H.read_line(l.c, H.T(60)))) end
    assert.equal(tostring(8 * N), ask(lanes[1].c, "get main ctr"))
    assert.equal(tostring(8 * N), ask(lanes[8].c, "get main ctr"))
  end)

  it("expires items after their ttl; get_stale still sees them until they go", function()
    local _, port = start({}, { workers = 2, threads = 1 })
    local lanes = reach(port, 2)
    local a, b = lanes[1].c, lanes[2].c
    assert.equal("ok false", ask(a, "set main t soon 0.3"))
    assert.equal("ok false", ask(a, "set main p kept"))
    assert.equal("soon", ask(b, "get main t"))
    local left = tonumber(ask(b, "ttl main t"))
    assert.truthy(left > 0 and left <= 0.3, "ttl " .. left)
    assert.equal("0.000", ask(b, "ttl main p"))
    H.sleep(0.45)
    assert.equal("nil", ask(b, "get main t"))
    assert.equal("soon true", ask(a, "stale main t"))
    assert.equal("err not found", ask(a, "ttl main t"))
    assert.equal("kept false", ask(a, "stale main p"))
    -- expire gives a live item a ttl; flush_expired drops what expired
    assert.equal("ok", ask(b, "expire main p 0.2"))
    assert.equal("err not found", ask(b, "expire main nothing 1"))
    H.sleep(0.35)
    assert.equal("nil", ask(a, "get main p"))
    assert.equal("2", ask(a, "flushx main"))
    assert.equal("nil", ask(a, "stale main t"))
  end)

  it("a full dictionary evicts the least recently used items (forcible)", function()
    local _, port = start({}, { workers = 2, threads = 1 })
    local lanes = reach(port, 2)
    local a, b = lanes[1].c, lanes[2].c
    -- "small" is 8k: about 30 items of 200 bytes
    assert.equal("filled 0", ask(a, "fill small 10 200"))
    assert.equal(("x"):rep(200), ask(b, "get small f1")) -- f1 is used again
    local v = ("y"):rep(200)
    local forced = 0
    -- 25 more: about 5 must go, the least recently used first
    for i = 1, 25 do
      local r = ask(i % 2 == 0 and a or b, ("set small g%d %s"):format(i, v))
      assert.truthy(r == "ok false" or r == "ok true", r)
      if r == "ok true" then forced = forced + 1 end
    end
    assert.truthy(forced > 0)
    assert.equal(("x"):rep(200), ask(a, "get small f1"))     -- kept: recently used
    assert.equal("nil", ask(a, "get small f2"))              -- the oldest went
    assert.equal(v, ask(b, "get small g25"))                 -- the newest is there
    local cap, free = ask(a, "space small"):match("^(%d+) (%d+)$")
    assert.truthy(tonumber(cap) > 7000 and tonumber(free) < tonumber(cap))
    assert.equal("ok", ask(b, "flush small"))
    assert.equal(cap .. " " .. cap, ask(a, "space small"))
    assert.equal("0", ask(a, "keys small"))
  end)

  it("refuses keys and values over the limits with a clear error", function()
    local _, port = start({}, { workers = 2, threads = 1 })
    local c = reach(port, 1)[1].c
    assert.equal("ok false", ask(c, "bigkey main 4096"))
    assert.equal("err key too long (at most 4096 bytes) false", ask(c, "bigkey main 4097"))
    local r = ask(c, "bigval main 200000")
    assert.truthy(r:match("^err value too large %(key and value at most %d+ bytes in this dictionary%) false$"), r)
    assert.truthy(ask(c, "bigval small 5000"):match("^err value too large"))
    assert.equal("ok false", ask(c, "bigval main 100000"))
    assert.equal(("v"):rep(100000), ask(c, "get main big"))
    assert.equal("err not a number", ask(c, "incr main big 1"))
    -- the worker is fine
    assert.equal("ok false", ask(c, "set main after ok"))
    assert.equal("ok", ask(c, "get main after"))
  end)

  it("keeps its items across a reload and a worker killed with kill -9", function()
    local dir = H.tmpdir()
    local sizefile = dir .. "/size"
    local f = assert(io.open(sizefile, "w")) f:write("1m\n") f:close()
    local srv, port = start({ sizefile }, { workers = 2, threads = 1, options = { "-v" } })
    local c = reach(port, 1)[1].c
    assert.equal("ok false", ask(c, "set main survivor here"))
    assert.equal("1", ask(c, "incr main count 1 0"))
    c:close()
    local before = H.children(srv:pid())
    -- reload: new workers, same dictionary
    assert.equal(0, ffi.C.kill(srv:pid(), H.SIGHUP))
    srv:wait_stderr("SIGHUP: reloaded", H.T(10), true)
    H.wait_for(function()
      local kids = H.children(srv:pid())
      if #kids ~= 2 then return false end
      for _, k in ipairs(kids) do
        for _, o in ipairs(before) do if k == o then return false end end
        if not H.pid_listens_on(k, port) then return false end
      end
      return true
    end, H.T(15), function() return "new workers: " .. srv:describe() end)
    local lanes = reach(port, 2)
    for _, l in ipairs(lanes) do
      assert.equal("here", ask(l.c, "get main survivor"))
      assert.equal("1", ask(l.c, "get main count"))
    end
    -- a worker killed outright: its replacement sees the same items
    local victim = lanes[1].pid
    for _, l in ipairs(lanes) do l.c:close() end
    assert.equal(0, ffi.C.kill(victim, H.SIGKILL))
    wait_workers(srv, port, 2, victim)
    for _, l in ipairs(reach(port, 2)) do
      assert.equal("here", ask(l.c, "get main survivor"))
      assert.equal("2", ask(l.c, "incr main count 1"))
      ask(l.c, "incr main count -1")
    end
  end)

  it("a reload that declares a dictionary with another size fails; the old code keeps serving", function()
    local dir = H.tmpdir()
    local sizefile = dir .. "/size"
    local f = assert(io.open(sizefile, "w")) f:write("1m\n") f:close()
    local srv, port = start({ sizefile }, { workers = 2, threads = 1, options = { "-v" } })
    local c = reach(port, 1)[1].c
    assert.equal("ok false", ask(c, "set main keep me"))
    local before = H.children(srv:pid())
    f = assert(io.open(sizefile, "w")) f:write("2m\n") f:close()
    assert.equal(0, ffi.C.kill(srv:pid(), H.SIGHUP))
    srv:wait_stderr("reload failed", H.T(10), true)
    assert.truthy(H.plain(srv:stderr(), "mp.shared: 'main' has another size (1048576 bytes"),
      srv:stderr())
    H.sleep(0.3)
    assert.same(before, H.children(srv:pid()))
    assert.equal("me", ask(c, "get main keep"))
    -- the size put back: the reload goes through, the items stay
    f = assert(io.open(sizefile, "w")) f:write("1024k\n") f:close()
    assert.equal(0, ffi.C.kill(srv:pid(), H.SIGHUP))
    srv:wait_stderr("SIGHUP: reloaded", H.T(10), true)
    c:close()
    H.wait_for(function()
      local kids = H.children(srv:pid())
      return #kids == 2 and kids[1] ~= before[1] and kids[1] ~= before[2]
        and kids[2] ~= before[1] and kids[2] ~= before[2]
        and H.pid_listens_on(kids[1], port) and H.pid_listens_on(kids[2], port)
    end, H.T(15), function() return "new workers: " .. srv:describe() end)
    assert.equal("me", ask(reach(port, 1)[1].c, "get main keep"))
  end)

  it("makes dictionaries only at the top level and from the root; a bad size is an error", function()
    local srv, port = start({ "-", "late" }, { workers = 2, threads = 1 })
    srv:wait_stdout("again: ", H.T(10), true)
    local out = srv:stdout()
    assert.truthy(H.plain(out, "late: mp.shared: 'late' is new: declare dictionaries at the script's top level"), out)
    assert.truthy(H.plain(out, 'late: mp.shared: size must be 8k to 16g ("16m", "512k" or bytes), not 1k'), out)
    assert.truthy(H.plain(out, "late: mp.shared: 'nosize' is new"), out)
    assert.truthy(H.plain(out, "again: small"), out)
    -- the workers serve on
    assert.equal("ok false", ask(H.connect(port), "set main x y"))
  end)

  it("a worker can't make a dictionary the root does not have", function()
    local port = H.free_port()
    local srv = H.spawn({ H.bin, "-w", "2", "-t", "1", H.fixture("shared_app.lua"),
                          tostring(port), "-", "workeronly" })
    srv:wait_stderr("mp.shared: 'wo' is not known to the root process", H.T(10), true)
    local kids = H.children(srv:pid())
    srv:kill(H.SIGKILL)
    srv:wait_exit(5)
    for _, p in ipairs(kids) do ffi.C.kill(p, H.SIGKILL) end
  end)

  it("--max-memory does not count a dictionary's pages against the workers that use it", function()
    local dir = H.tmpdir()
    local sizefile = dir .. "/size"
    local f = assert(io.open(sizefile, "w")) f:write("128m\n") f:close()
    local srv, port = start({ sizefile }, { workers = 2, threads = 1,
                                             options = { "--max-memory", "60" } })
    local before = H.children(srv:pid())
    local c = reach(port, 1)[1].c
    -- 90 MB of values (in 128 KiB blocks: some are evicted again), all
    -- touched by this worker and mapped by both
    assert.truthy(ask(c, "fill main 900 100000", H.T(30)):match("^filled %d+$"))
    local cap, free = ask(c, "space main"):match("^(%d+) (%d+)$")
    assert.truthy(tonumber(cap) - tonumber(free) > 80e6, cap .. " " .. free)
    H.sleep(1.5) -- the root checks memory twice a second
    -- TSan's shadow of the pages touched is the worker's own memory, so
    -- under TSan the worker does pass the limit
    if not H.bin:find("tsan", 1, true) then
      assert.same(before, H.children(srv:pid()))
      assert.falsy(H.plain(srv:stderr(), "max-memory"), srv:stderr())
      assert.equal(("x"):rep(100000), ask(c, "get main f900"))
    end
  end)

  it("stays usable when workers are killed with kill -9 in the middle of writing, again and again", function()
    local srv, port = start({}, { workers = 2, threads = 1 })
    local kills = 0
    for round = 1, 8 do
      local lanes = reach(port, 2)
      -- both workers write in a tight loop; one of them is killed
      for _, l in ipairs(lanes) do assert(H.send(l.c, "spin main 1500\n")) end
      H.sleep(0.05 + 0.02 * (round % 4))
      local victim = lanes[round % 2 + 1]
      assert.equal(0, ffi.C.kill(victim.pid, H.SIGKILL))
      kills = kills + 1
      local other = lanes[(round + 1) % 2 + 1]
      assert.truthy(assert(H.read_line(other.c, H.T(20))):match("^spun %d+$"))
      for _, l in ipairs(lanes) do l.c:close() end
      wait_workers(srv, port, 2, victim.pid)
    end
    assert.equal(8, kills)
    -- every shard can be locked again: reads, writes and incr everywhere
    local lanes = reach(port, 2)
    for i, l in ipairs(lanes) do
      assert.equal("done", ask(l.c, "hammer main after 500", H.T(10)))
      assert.equal("ok false", ask(l.c, "set main last" .. i .. " yes"))
    end
    assert.equal("1000", ask(lanes[1].c, "get main after"))
    for i = 1, 2 do
      for _, l in ipairs(lanes) do assert.equal("yes", ask(l.c, "get main last" .. i)) end
    end
    for n = 0, 199 do ask(lanes[1].c, "get main s" .. n) end  -- every key readable
    assert.truthy(tonumber(ask(lanes[2].c, "keys main 0")) > 0)
    assert.falsy(H.plain(srv:stderr(), "AddressSanitizer"))
  end)
end)
