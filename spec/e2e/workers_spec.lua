-- Spec: worker processes (-w N / --workers N / MOONPORT_WORKERS). With N > 1
-- the root loads the script (opening the listening sockets) and forks N
-- workers that serve connections; a worker that dies is replaced; a root
-- that dies takes its workers with it; SIGTERM/SIGINT to the root shut every
-- worker down gracefully; startup errors happen before any fork.
local H = require "spec.helper"
local ffi = require "ffi"     -- kill(2) is declared by spec/helper.lua
local socket = require "socket"

---------------------------------------------------------------------------
-- /proc helpers
---------------------------------------------------------------------------

local running, all_pids, children, cmdline =
  H.running, H.all_pids, H.children, H.cmdline

-- Running processes whose command line runs a workers_* fixture on `port`
-- (the root and its workers, whether or not they were re-executed).
local function processes_on(port)
  local t = {}
  local needle = ".lua " .. port .. " "
  for _, pid in ipairs(all_pids()) do
    local cl = cmdline(pid)
    if cl and cl:find("/workers_", 1, true) and cl:find(needle, 1, true) and running(pid) then
      t[#t + 1] = pid
    end
  end
  return t
end

local function kill(pid, sig) return ffi.C.kill(pid, sig or H.SIGKILL) end

local set_of = H.set_of

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

local plain = H.plain

---------------------------------------------------------------------------
-- Bookkeeping so that no process outlives its test
---------------------------------------------------------------------------

local started, tracked, ports = {}, {}, {}

local function track(pids)
  for _, p in ipairs(pids) do tracked[p] = true end
end

local function cleanup()
  for _, srv in ipairs(started) do
    if srv:alive() then track(children(srv:pid())) end
  end
  local ok, err = pcall(H.cleanup)      -- SIGKILLs the roots still running
  for pid in pairs(tracked) do
    local cl = cmdline(pid)
    if running(pid) and cl and (plain(cl, "/workers_") or plain(cl, H.bin)) then
      kill(pid)
    end
  end
  for _, port in ipairs(ports) do
    for _, pid in ipairs(processes_on(port)) do kill(pid) end
  end
  started, tracked, ports = {}, {}, {}
  if not ok then error(err, 0) end
end

local function new_port()
  local port = H.free_port()
  ports[#ports + 1] = port
  return port
end

-- Starts workers_echo.lua with `n` workers (opts.options replaces the
-- default { "-w", n }) and waits until the root has `n` children whose
-- every lane ran its "worker_start" handler (for n > 1) or, for n == 1, the
-- process's lanes ran "start".
local function start_workers(n, opts)
  opts = opts or {}
  local port = new_port()
  local srv = H.start(opts.script or "workers_echo.lua", {
    args = { port }, wait_port = port, grace = opts.grace, env = opts.env,
    options = opts.options or { "-w", n },
  })
  started[#started + 1] = srv
  local lanes = srv.threads
  H.wait_for(function()
    if not srv:alive() then error("root exited: " .. srv:describe(), 0) end
    local kids = children(srv:pid())
    track(kids)
    if n == 1 then return #srv:stdout_lines("^start ") >= lanes end
    return #kids == n and #srv:stdout_lines("^worker_start ") >= n * lanes
  end, H.T(10), function()
    return ("%d workers to start (children now: %s): %s"):format(n,
      table.concat(children(srv:pid()), ","), srv:describe())
  end)
  return srv, port
end

-- Opens `n` connections at once, then asks each "who". Returns a list of
-- { c = conn, pid =, w = worker number, n = worker count }.
local function open_who(port, n)
  local cs, res = {}, {}
  for i = 1, n do cs[i] = H.connect(port) end
  for i = 1, n do assert.is_true(H.send(cs[i], "who\n")) end
  for i = 1, n do
    local line, err = H.read_line(cs[i], H.T(5))
    assert.truthy(line, ("connection %d: no reply to who (%s)"):format(i, tostring(err)))
    local pid, w, nn = line:match("^(%d+) (%d+) (%d+)$")
    assert.truthy(pid, "bad reply to who: " .. line)
    res[i] = { c = cs[i], pid = tonumber(pid), w = tonumber(w), n = tonumber(nn) }
  end
  return res
end

-- Opens connections in batches (40, then 20 at a time, up to `max`) until
-- `done(by_pid)` is true; by_pid maps a serving pid to the list of its
-- connections. Raises with the distribution if it never is.
local function open_until(port, done, max, what)
  local by, all, total = {}, {}, 0
  local batch = 40
  while true do
    for _, r in ipairs(open_who(port, batch)) do
      by[r.pid] = by[r.pid] or {}
      table.insert(by[r.pid], r)
      all[#all + 1] = r
    end
    total = total + batch
    if done(by) then return by, all end
    if total >= (max or 200) then
      local dist = {}
      for pid, l in pairs(by) do dist[#dist + 1] = ("pid %d: %d"):format(pid, #l) end
      error(("%s: not after %d connections (served by %s)"):format(
        what or "connections", total, table.concat(dist, ", ")), 2)
    end
    batch = 20
  end
end

local function two_pids(by) return count(by) >= 2 end

-- The one stderr line that mentions "(pid <pid>)"; checks it is a single
-- "moonport: " line naming worker `w`.
local function death_line(srv, pid, w)
  srv:wait_stderr("(pid " .. pid .. ")", H.T(3), true)
  local found = {}
  for _, l in ipairs(H.lines(srv:stderr())) do
    if plain(l, "(pid " .. pid .. ")") then found[#found + 1] = l end
  end
  assert.equal(1, #found, "expected one line about pid " .. pid .. ":\n" .. srv:stderr())
  local l = found[1]
  assert.equal("moonport: ", l:sub(1, 10), l)
  assert.truthy(l:find("worker " .. w .. "%f[%D]"), "worker number " .. w .. " not named in: " .. l)
  return l
end

-- Waits until the root's children are `survivor` plus one new pid (not
-- `victim`); returns the new pid. `each` runs on every poll.
local function wait_replacement(srv, victim, survivor, each)
  local newpid
  H.wait_for(function()
    if each then each() end
    local kids = children(srv:pid())
    track(kids)
    if #kids ~= 2 then return false end
    local s = set_of(kids)
    if not s[survivor] or s[victim] then return false end
    newpid = kids[1] == survivor and kids[2] or kids[1]
    return true
  end, H.T(2), function()
    return ("a replacement for worker pid %d (children: %s): %s"):format(victim,
      table.concat(children(srv:pid()), ","), srv:describe())
  end, 0.05)
  return newpid
end

-- Opens `n` connections at once; returns them grouped by the pid that
-- serves them (pid -> list of open_who results) and the root's children.
-- Every connection must be served by one of those children.
local function serve(srv, port, n)
  local kids = children(srv:pid())
  assert.equal(2, #kids, "children of the root: " .. table.concat(kids, ","))
  local ks, by = set_of(kids), {}
  for _, r in ipairs(open_who(port, n)) do
    assert.truthy(ks[r.pid], ("connection served by pid %d, not a worker of root %d (workers %s)")
      :format(r.pid, srv:pid(), table.concat(kids, ",")))
    by[r.pid] = by[r.pid] or {}
    table.insert(by[r.pid], r)
  end
  return by, kids
end

-- The worker (of two) serving the most connections in `by`, and the other.
local function busiest(by, kids)
  local a, b = kids[1], kids[2]
  if #(by[b] or {}) > #(by[a] or {}) then a, b = b, a end
  return a, b
end

-- A worker pid's mp.worker(), from its "worker_start" stdout lines.
local function worker_num(srv, pid)
  local l = srv:stdout_lines("^worker_start worker w=%d+ n=%d+ pid=" .. pid .. "$")[1]
  if l then return tonumber(l:match(" w=(%d+) ")) end
  error("no worker_start line from pid " .. pid .. ":\n" .. srv:stdout(), 2)
end

---------------------------------------------------------------------------

describe("workers", function()
  after_each(cleanup)

  it("-w 2: two worker processes serve connections; the root serves none", function()
    local srv, port = start_workers(2)
    local root = srv:pid()
    local lanes = srv.threads
    local kids = children(root)
    assert.equal(2, #kids, "children of the root: " .. table.concat(kids, ","))
    local kidset = set_of(kids)

    local by = open_until(port, two_pids, 200, "two workers serving")
    local wnum = {}
    for pid, list in pairs(by) do
      assert.is_true(pid ~= root, "the root (pid " .. root .. ") served a connection")
      assert.truthy(kidset[pid], ("pid %d served a connection but is not a child of the root"):format(pid))
      for _, r in ipairs(list) do
        assert.equal(2, r.n, "mp.workers() in a worker")
        assert.is_true(r.w == 1 or r.w == 2, "mp.worker() = " .. r.w)
        assert.equal(wnum[pid] or r.w, r.w, "pid " .. pid .. " reported two worker numbers")
        wnum[pid] = r.w
      end
    end
    local pids = {}
    for pid in pairs(by) do pids[#pids + 1] = pid end
    assert.are_not.equal(wnum[pids[1]], wnum[pids[2]], "both workers say they are worker " .. wnum[pids[1]])
    -- echo works too
    local c = by[pids[1]][1].c
    assert.equal("hello\n", H.roundtrip(c, "hello\n"))

    -- what ran where: top level and "start" in the root's lane and in every
    -- worker lane, "worker_start" in worker lanes only
    local out = srv:stdout()
    local function lines(pat) return srv:stdout_lines(pat) end
    assert.same({ ("top root w=0 n=2 pid=%d"):format(root) }, lines("^top root"), out)
    assert.same({ ("start root w=0 n=2 pid=%d"):format(root) }, lines("^start root"), out)
    assert.same({}, lines("^worker_start root"), out)
    for _, what in ipairs { "top", "start", "worker_start" } do
      local per = {}
      for _, l in ipairs(lines("^" .. what .. " worker ")) do
        local w, n, pid = l:match("^%S+ worker w=(%d+) n=(%d+) pid=(%d+)$")
        assert.truthy(w, "bad line: " .. l)
        pid = tonumber(pid)
        assert.equal("2", n, l)
        assert.truthy(kidset[pid], l .. ": not a child of the root\n" .. out)
        if wnum[pid] then assert.equal(wnum[pid], tonumber(w), l) end
        per[pid] = (per[pid] or 0) + 1
      end
      for _, pid in ipairs(kids) do
        assert.equal(lanes, per[pid] or 0,
          ("%q lines from worker pid %d (one per lane expected):\n%s"):format(what, pid, out))
      end
    end
    assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))
  end)

  it("replaces a worker killed with SIGKILL; the other worker's clients are untouched", function()
    local srv, port = start_workers(2)
    local by, kids = serve(srv, port, 40)
    -- the survivor is a worker that has clients; the victim is the other one
    -- (it has clients too unless the kernel gave every connection to one)
    local survivor, victim = busiest(by, kids)
    local vw = worker_num(srv, victim)
    local sc = by[survivor][1].c
    assert.equal("before\n", H.roundtrip(sc, "before\n"))

    assert.equal(0, kill(victim, H.SIGKILL))
    local i = 0
    local newpid = wait_replacement(srv, victim, survivor, function()
      i = i + 1
      local msg = "ping " .. i .. "\n"
      assert.equal(msg, H.roundtrip(sc, msg, nil, H.T(2)),
        "the other worker's client stopped echoing")
    end)
    assert.is_true(newpid ~= srv:pid())
    assert.is_false(running(victim))

    -- the killed worker's clients were cut; the other's are still served
    for k, r in ipairs(by[victim] or {}) do
      local _, err = H.read_to_eof(r.c, H.T(3))
      assert.is_true(err ~= "timeout", "connection " .. k .. " to the killed worker is still open")
    end
    for k, r in ipairs(by[survivor]) do
      assert.equal("after " .. k .. "\n", H.roundtrip(r.c, "after " .. k .. "\n"))
    end
    assert.truthy(running(survivor))

    local l = death_line(srv, victim, vw)
    assert.truthy(l:find("signal 9%f[%D]"), "signal 9 not named in: " .. l)

    -- the new worker runs every lane's worker_start, takes over number vw
    -- and holds the listening socket
    H.wait_for(function()
      return #srv:stdout_lines("^worker_start worker w=%d+ n=2 pid=" .. newpid .. "$") >= srv.threads
    end, H.T(5), function() return "worker_start from the new worker: " .. srv:describe() end)
    assert.equal(vw, worker_num(srv, newpid), "the new worker's mp.worker()")
    assert.is_true(H.pid_listens_on(newpid, port), "the new worker has no listening socket")

    -- new connections are served (by the survivor or the new worker)
    for _, r in ipairs(open_who(port, 20)) do
      assert.truthy(r.pid == survivor or r.pid == newpid, "served by unexpected pid " .. r.pid)
      assert.same({ worker_num(srv, r.pid), 2 }, { r.w, r.n })
    end
    assert.equal("still\n", H.roundtrip(sc, "still\n"))
    assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))
  end)

  it("a replacement worker serves connections", function()
    local srv, port = start_workers(2)
    local kids = children(srv:pid())
    assert.equal(0, kill(kids[1], H.SIGKILL))
    local newpid = wait_replacement(srv, kids[1], kids[2])
    H.wait_for(function()
      return #srv:stdout_lines("^worker_start worker w=%d+ n=2 pid=" .. newpid .. "$") >= srv.threads
    end, H.T(5), function() return "worker_start from the new worker: " .. srv:describe() end)
    open_until(port, function(b) return b[newpid] ~= nil end, 200,
      "the new worker (pid " .. newpid .. ") serving")
    assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))
  end)

  it("replaces a worker that calls os.exit(3) in a handler; the log says status 3", function()
    local srv, port = start_workers(2)
    local by, kids = serve(srv, port, 40)
    local victim, survivor = busiest(by, kids)
    local vw = worker_num(srv, victim)
    local sc = by[survivor] and by[survivor][1].c

    assert.is_true(H.send(by[victim][1].c, "exit 3\n"))
    local newpid = wait_replacement(srv, victim, survivor, sc and function()
      assert.equal("x\n", H.roundtrip(sc, "x\n", nil, H.T(2)), "the other worker's client stopped echoing")
    end)
    for k, r in ipairs(by[victim]) do
      local _, err = H.read_to_eof(r.c, H.T(3))
      assert.is_true(err ~= "timeout", "connection " .. k .. " to the exited worker is still open")
    end

    local l = death_line(srv, victim, vw)
    assert.truthy(l:find("status 3%f[%D]"), "exit status 3 not named in: " .. l)
    assert.falsy(l:find("signal", 1, true), l)

    for _, r in ipairs(open_who(port, 20)) do
      assert.truthy(r.pid == survivor or r.pid == newpid, "served by unexpected pid " .. r.pid)
    end
    for _, r in ipairs(by[survivor] or {}) do
      assert.equal("y\n", H.roundtrip(r.c, "y\n"))
    end
    assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))
  end)

  it("workers exit when the root is killed with SIGKILL; nothing is left listening", function()
    local srv, port = start_workers(2)
    local kids = children(srv:pid())
    local all = open_who(port, 10)
    srv:kill(H.SIGKILL)
    assert.is_not_nil(srv:wait_exit(H.T(3)))

    local t0 = H.now()
    H.wait_for(function()
      for _, p in ipairs(kids) do if running(p) then return false end end
      return true
    end, H.T(3), function()
      local left = {}
      for _, p in ipairs(kids) do if running(p) then left[#left + 1] = p end end
      return "workers to exit after the root died; still running: " .. table.concat(left, ",")
        .. "\n" .. srv:describe()
    end, 0.02)
    local took = H.now() - t0
    assert.is_true(took <= H.T(2) + 0.5, ("workers took %.2fs to exit"):format(took))
    assert.same({}, processes_on(port))
    assert.is_false(H.is_listening(port))
    local c, cerr = H.try_connect(port, { timeout = 1 })
    if c then c:close() end
    assert.is_nil(c, "the port still accepts connections")
    assert.truthy(cerr)
    -- every client was disconnected
    for i, r in ipairs(all) do
      local _, err = H.read_to_eof(r.c, H.T(1))
      assert.is_true(err ~= "timeout", "client " .. i .. " still connected")
    end
  end)

  for _, case in ipairs { { "SIGTERM", H.SIGTERM }, { "SIGINT", H.SIGINT } } do
    it(case[1] .. " to the root shuts every worker down gracefully and exits 0", function()
      local srv, port = start_workers(2, { grace = 5 })
      local kids = children(srv:pid())
      local all = open_who(port, 40)
      local t0 = H.now()
      local st, how = srv:stop(case[2], H.T(8))
      assert.equal(0, st, tostring(how) .. ": " .. srv:describe())
      assert.is_true(H.now() - t0 < H.T(4), "shutdown took the whole grace period")
      -- the root exits only once its workers are gone
      for _, p in ipairs(kids) do
        assert.is_false(running(p), "worker pid " .. p .. " still running after the root exited")
      end
      assert.same({}, processes_on(port))
      assert.is_false(H.is_listening(port))
      for i, r in ipairs(all) do
        local data, err = H.read_to_eof(r.c, H.T(3))
        assert.equal(("bye %d\n"):format(r.pid), data,
          ("client %d (worker pid %d): %s"):format(i, r.pid, tostring(err)))
      end
      -- no worker was reported dead or replaced during the shutdown
      for _, l in ipairs(H.lines(srv:stderr())) do
        assert.is_false(plain(l, "moonport: "), "root logged during shutdown: " .. l)
      end
    end)
  end

  describe("startup errors with -w 2 happen before any fork", function()
    local one_line = H.one_line

    local function run_w2(script, port)
      local st, out, err, how = H.run { "-w", 2, H.fixture(script), port }
      assert.same({}, processes_on(port), "processes left: " .. err)
      return st, out, err, how
    end

    it("error at top level: status 1, one line, no worker, port released", function()
      local port = new_port()
      local st, out, err = run_w2("workers_top_error.lua", port)
      assert.equal(1, st, "stderr: " .. err)
      local l = one_line(err)
      assert.is_true(plain(l, "workers_top_error.lua"), l)
      assert.is_true(plain(l, "workers top level failure"), l)
      -- only the root ran the top level
      assert.equal(1, #H.lines(out), "top level ran more than once:\n" .. out)
      assert.matches("^top root pid=%d+$", H.lines(out)[1])
      assert.is_false(H.is_listening(port))
    end)

    it("a second server on the port of a running -w 2 server fails with \"address already in use\" (status 1), with -w 2 or -w 1; the first keeps every connection", function()
      local srv, port = start_workers(2)
      local before = #H.listening_inodes(port)
      for _, w in ipairs { "2", "1" } do
        local st, _, err = H.run { "-w", w, H.fixture("workers_echo.lua"), port }
        assert.equal(1, st, "-w " .. w .. ": " .. err)
        local l = one_line(err)
        assert.is_true(plain(l, tostring(port)) and plain(l:lower(), "in use"), l)
        assert.equal(before, #H.listening_inodes(port))
      end
      serve(srv, port, 10)   -- every connection is the first server's
      -- and a -w 1 server refuses a -w 2 one after it
      local solo_port = new_port()
      local solo = H.start("workers_echo.lua", { args = { solo_port }, wait_port = solo_port,
        options = { "-w", "1" } })
      started[#started + 1] = solo
      local st, _, err = H.run { "-w", "2", H.fixture("workers_echo.lua"), solo_port }
      assert.equal(1, st, err)
      assert.equal(1, #H.listening_inodes(solo_port))
    end)

    it("syntax error, missing script, port in use", function()
      local port = new_port()
      local st, _, err = run_w2("workers_syntax_error.lua", port)
      assert.equal(1, st, "stderr: " .. err)
      local l = one_line(err)
      assert.is_true(plain(l, "workers_syntax_error.lua") and plain(l, ":4:"), l)

      port = new_port()
      st, _, err = run_w2("workers_does_not_exist.lua", port)
      assert.equal(1, st, "stderr: " .. err)
      l = one_line(err)
      assert.is_true(plain(l, "workers_does_not_exist.lua"), l)

      port = new_port()
      local holder = assert(socket.bind("0.0.0.0", port))
      st, _, err = run_w2("workers_echo.lua", port)
      assert.equal(1, st, "stderr: " .. err)
      l = one_line(err)
      assert.is_true(plain(l, tostring(port)), "port not named in: " .. l)
      assert.equal(1, #H.listening_inodes(port))   -- the spec's own
      holder:close()
      assert.is_false(H.is_listening(port))
    end)
  end)

  describe("worker count", function()
    it("MOONPORT_WORKERS=2 works like -w 2, and --workers / -w win over it", function()
      local srv, port = start_workers(2, { options = {}, env = { MOONPORT_WORKERS = "2" } })
      local by = serve(srv, port, 10)    -- 2 children serve every connection
      for _, list in pairs(by) do
        for _, r in ipairs(list) do assert.equal(2, r.n) end
      end
      assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))

      srv, port = start_workers(2, { options = { "--workers", "2" }, env = { MOONPORT_WORKERS = "3" } })
      H.sleep(0.3)
      assert.equal(2, #children(srv:pid()))
      local r = open_who(port, 1)[1]
      assert.equal(2, r.n)
      assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))
    end)

    it("-w 1 and MOONPORT_WORKERS=1 run one process that serves itself (no fork)", function()
      for _, case in ipairs {
        { options = { "-w", "1" }, env = { MOONPORT_WORKERS = false } },
        { options = {}, env = { MOONPORT_WORKERS = "1" } },
      } do
        local srv, port = start_workers(1, case)
        local root = srv:pid()
        H.sleep(0.2)
        assert.same({}, children(root))
        local rs = open_who(port, 4)
        for _, r in ipairs(rs) do
          assert.same({ root, 1, 1 }, { r.pid, r.w, r.n })
        end
        local out = srv:stdout()
        assert.same({}, srv:stdout_lines("^%S+ root "), out)
        for _, l in ipairs(srv:stdout_lines("^start ")) do
          assert.equal(("start worker w=1 n=1 pid=%d"):format(root), l)
        end
        assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))
      end
    end)

    -- CPUs this process may run on, as nproc(1) counts them.
    local function nproc(prefix)
      local p = assert(io.popen((prefix or "") .. "nproc"))
      local n = tonumber(p:read("*l"))
      p:close()
      assert.truthy(n and n >= 1, "nproc")
      return n
    end

    it("the default (no -w, no MOONPORT_WORKERS) is a worker per CPU core, as nproc counts them", function()
      local n = math.min(nproc(), 256)
      local srv, port = start_workers(n, { options = {}, env = { MOONPORT_WORKERS = false } })
      local root = srv:pid()
      H.sleep(0.2)
      local kids = children(root)
      if n == 1 then
        assert.same({}, kids)
      else
        assert.equal(n, #kids, "children of the root: " .. table.concat(kids, ","))
        assert.same({ ("top root w=0 n=%d pid=%d"):format(n, root) }, srv:stdout_lines("^top root"))
      end
      local ks = set_of(kids)
      for _, r in ipairs(open_who(port, 10)) do
        assert.equal(n, r.n, "mp.workers()")
        if n > 1 then
          assert.truthy(ks[r.pid], "served by pid " .. r.pid .. ", not a worker")
        else
          assert.equal(root, r.pid)
        end
      end
      assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))
    end)

    it("the default counts the CPUs the process may run on (taskset -c 0: one process)", function()
      local taskset
      for _, p in ipairs { "/usr/bin/taskset", "/bin/taskset" } do
        if H.exists(p) then taskset = p break end
      end
      if not taskset or nproc() < 2 then
        pending("needs taskset and at least two CPUs")
        return
      end
      assert.equal(1, nproc(taskset .. " -c 0 "))
      local port = new_port()
      local srv = H.spawn({ taskset, "-c", "0", H.bin, H.fixture("workers_echo.lua"), tostring(port) },
        { env = { MOONPORT_WORKERS = false } })
      started[#started + 1] = srv
      H.wait_for(function()
        if not srv:alive() then error("exited: " .. srv:describe(), 0) end
        return srv:listens_on(port) and #srv:stdout_lines("^start ") >= 1
      end, H.T(10), function() return "server start: " .. srv:describe() end)
      H.sleep(0.2)
      assert.same({}, children(srv:pid()))
      for _, r in ipairs(open_who(port, 4)) do
        assert.same({ srv:pid(), 1, 1 }, { r.pid, r.w, r.n })
      end
      assert.equal(0, srv:stop(H.SIGTERM, H.T(8)))
    end)

    it("-w 0, -w abc, -w 257 and --workers abc are usage errors", function()
      for _, args in ipairs { { "-w", "0" }, { "-w", "abc" }, { "-w", "257" }, { "--workers", "abc" } } do
        local port = new_port()
        local st, _, err = H.run { args[1], args[2], H.fixture("workers_echo.lua"), port }
        assert.equal(2, st, table.concat(args, " ") .. ": " .. err)
        local lines = H.lines(err)
        assert.equal(1, #lines, table.concat(args, " ") .. ": " .. err)
        assert.equal("moonport: ", lines[1]:sub(1, 10), err)
        assert.is_true(plain(lines[1], args[2]) or plain(lines[1], args[1]), lines[1])
        assert.is_false(H.is_listening(port))
        assert.same({}, processes_on(port))
      end
    end)
  end)
end)
