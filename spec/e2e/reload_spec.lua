-- Spec: hot reload of the script (-w 2 or more). SIGHUP to the root,
-- `moonport --reload PIDFILE` or --watch make the root load the script anew
-- in a fresh root VM; if that works, the workers are replaced one at a
-- time by processes that load the new code (each new one serves before
-- the old one drains), so new connections get the new code while open
-- ones finish on the old code, up to --drain-timeout. A script that does
-- not load changes nothing (one line on stderr). mp.on("reload") runs in
-- each replaced lane and may hand state over by pub/sub.
--
-- The script is spec/fixtures/reload_app.lua, copied into a temp dir with
-- its version ("v1", "v2", ...) filled in, and rewritten there.
local H = require "spec.helper"
local lfs = require "lfs"
local ffi = require "ffi"     -- kill(2) is declared by spec/helper.lua

local children, running = H.children, H.running

local function kill(pid, sig) return ffi.C.kill(pid, sig) end
local plain = H.plain

local TEMPLATE = assert(H.read_file(H.fixture("reload_app.lua")))

local function app_text(version, extra)
  return (TEMPLATE:gsub("@VERSION@", version)) .. (extra or "")
end

local function write_file(path, text)
  local f = assert(io.open(path, "wb"))
  assert(f:write(text))
  assert(f:close())
end

local count_lines, set_of = H.count_lines, H.set_of

---------------------------------------------------------------------------
-- Servers and their workers
---------------------------------------------------------------------------

local apps = {}

local function cleanup()
  local kids = {}
  for _, app in ipairs(apps) do
    for _, p in ipairs(children(app.root)) do kids[#kids + 1] = p end
    for p in pairs(app.seen) do kids[#kids + 1] = p end
  end
  local ok, err = pcall(H.cleanup)     -- SIGKILLs the roots
  for _, p in ipairs(kids) do
    local cl = H.cmdline(p)
    if running(p) and cl and plain(cl, "app.lua") then kill(p, H.SIGKILL) end
  end
  apps = {}
  if not ok then error(err, 0) end
end

-- Writes v1 of the app into a fresh temp dir and starts it with -w N
-- (default 2), --log-level info (unless opts.quiet) and opts.options;
-- waits until every worker runs.
local function start_app(opts)
  opts = opts or {}
  local n = opts.workers or 2
  local dir = H.tmpdir()
  local path = dir .. "/app.lua"
  write_file(path, app_text("v1", opts.extra))
  local port = H.free_port()
  local options = { "-w", n }
  if not opts.quiet then -- a routine reload logs at info
    options[#options + 1] = "--log-level"
    options[#options + 1] = "info"
  end
  for _, o in ipairs(opts.options or {}) do options[#options + 1] = o end
  local srv = H.start(path, { threads = 1, grace = opts.grace, options = options,
                              args = { port }, wait_port = port })
  local app = { srv = srv, root = srv:pid(), port = port, path = path, dir = dir,
                n = n, seen = {} }
  apps[#apps + 1] = app
  H.wait_for(function()
    if not srv:alive() then error("root exited: " .. srv:describe(), 0) end
    return #children(app.root) == n and #srv:stdout_lines("^start worker v1 ") >= n
  end, H.T(10), function() return n .. " workers serving: " .. srv:describe() end)
  for _, p in ipairs(children(app.root)) do app.seen[p] = true end
  return app
end

-- Rewrites the app as `version` (plus `extra` Lua code at the end).
local function write_app(app, version, extra)
  write_file(app.path, app_text(version, extra))
end

-- One line of request on a fresh connection; the reply line or nil, err.
local function ask(port, line, timeout)
  timeout = timeout or H.T(3)
  local c, err = H.try_connect(port, { timeout = timeout })
  if not c then return nil, "connect: " .. tostring(err) end
  local ok, e = H.send(c, line .. "\n", timeout)
  if not ok then c:close() return nil, "send: " .. tostring(e) end
  local l, e2 = H.read_line(c, timeout)
  c:close()
  if not l then return nil, "read: " .. tostring(e2) end
  return l
end

-- "who" on a fresh connection: version, pid, worker number (or nil, err).
local function who(port)
  local l, err = ask(port, "who")
  if not l then return nil, err end
  local v, pid, w = l:match("^(%S+) (%d+) (%d+)$")
  if not v then return nil, "bad reply: " .. l end
  return v, tonumber(pid), tonumber(w)
end

-- Waits until every worker of `version` started and fresh connections get
-- that version; then checks 10 more in a row do. Returns the pids seen.
local function wait_rolled(app, version)
  local streak = 0
  H.wait_for(function()
    if not app.srv:alive() then error("root exited: " .. app.srv:describe(), 0) end
    if #app.srv:stdout_lines("^start worker " .. version .. " ") < app.n then return false end
    local v = who(app.port)
    streak = v == version and streak + 1 or 0
    return streak >= 5
  end, H.T(10), function()
    return "fresh connections served by " .. version .. ": " .. app.srv:describe()
  end)
  local pids = {}
  for i = 1, 10 do
    local v, pid = who(app.port)
    assert.equal(version, v, ("fresh connection %d after the reload to %s: %s"):format(
      i, version, tostring(pid)))
    pids[pid] = true
    app.seen[pid] = true
  end
  for _, p in ipairs(children(app.root)) do app.seen[p] = true end
  return pids
end

-- A persistent connection: sends a line, returns the reply line.
local function line_rt(c, line, timeout)
  local ok, err = H.send(c, line .. "\n", timeout or H.T(3))
  if not ok then return nil, err end
  return H.read_line(c, timeout or H.T(3))
end

---------------------------------------------------------------------------

describe("hot reload", function()
  after_each(cleanup)

  it("SIGHUP: new connections get the new code; an open one keeps the old code until it closes", function()
    local app = start_app()
    local srv = app.srv
    local before = children(app.root)
    local c = H.connect(app.port)
    local reply = assert(line_rt(c, "who"))
    local v, pid = reply:match("^(%S+) (%d+) %d+$")
    pid = tonumber(pid)
    assert.equal("v1", v)
    assert.truthy(set_of(before)[pid], "served by a non-worker: " .. reply)

    write_app(app, "v2")
    assert.equal(0, kill(app.root, H.SIGHUP))
    srv:wait_stderr("moonport: SIGHUP: reloaded " .. app.path, H.T(5), true)
    local new = wait_rolled(app, "v2")
    for p in pairs(new) do
      assert.is_nil(set_of(before)[p], "an old worker (pid " .. p .. ") serves the new code")
    end

    -- the old connection: same process, old code, still working
    assert.truthy(running(pid))
    assert.equal("v1 " .. pid, (assert(line_rt(c, "who")):match("^(%S+ %d+)")))
    assert.truthy(assert(line_rt(c, "hit")):match("^hit v1 " .. pid .. " %d+ 1$"))
    -- its reload handler ran (after its replacement was ready)
    srv:wait_stdout("reload worker v1 pid=" .. pid .. " ", H.T(3), true)

    -- closed by the client: the old worker goes away long before the
    -- default drain deadline (10 s)
    c:close()
    local t0 = H.now()
    H.wait_for(function() return not running(pid) end, H.T(4),
      function() return "old worker pid " .. pid .. " to exit: " .. srv:describe() end)
    assert.is_true(H.now() - t0 < H.T(4))
    H.wait_for(function()
      local kids = children(app.root)
      if #kids ~= 2 then return false end
      for _, k in ipairs(kids) do if set_of(before)[k] then return false end end
      return true
    end, H.T(5), function() return "only new workers left: " .. srv:describe() end)
    assert.falsy(plain(srv:stderr(), "reload failed"), srv:stderr())
    assert.falsy(plain(srv:stderr(), "killing it"), srv:stderr())
    assert.equal(0, srv:stop())
  end)

  it("a script that does not load changes nothing (one line on stderr); once fixed it reloads", function()
    local app = start_app { quiet = true }
    local srv = app.srv
    local before = children(app.root)
    local nlines = #H.lines(TEMPLATE)

    local function check_old_serves()
      assert.same(before, children(app.root))
      for i = 1, 10 do
        local v, pid = who(app.port)
        assert.equal("v1", v, "fresh connection " .. i .. ": " .. tostring(pid))
        assert.truthy(set_of(before)[pid], "served by pid " .. tostring(pid))
      end
      -- the root lane still runs the old code too
      local msg = "still" .. #srv:stdout()
      assert.equal("ok", ask(app.port, "pub " .. msg))
      srv:wait_stdout("rootsub v1 n=%d+ msg=" .. msg .. "\n", H.T(3))
    end

    -- 1. a syntax error
    write_app(app, "v2", "\nlocal x = = 1\n")
    local want1 = ("moonport: reload failed; the old code keeps serving: %s:%d: "):format(
      app.path, nlines + 2)
    assert.equal(0, kill(app.root, H.SIGHUP))
    srv:wait_stderr(want1, H.T(5), true)
    H.sleep(0.5)
    check_old_serves()
    local err = srv:stderr()
    assert.equal(1, count_lines(err, "reload failed"), err)
    assert.equal(1, count_lines(err, want1), err)
    assert.truthy(plain(err, want1 .. "unexpected symbol near '='\n"), err)

    -- 2. an error at top level (after the root lane's subscription and
    -- timer were set up: they must end with the failed VM)
    local mark = #srv:stdout()
    write_app(app, "v2", "\nerror('broken on purpose')\n")
    local want2 = ("moonport: reload failed; the old code keeps serving: %s:%d: broken on purpose"):format(
      app.path, nlines + 2)
    assert.equal(0, kill(app.root, H.SIGHUP))
    srv:wait_stderr(want2, H.T(5), true)
    H.sleep(0.5)
    check_old_serves()
    err = srv:stderr()
    assert.equal(2, count_lines(err, "reload failed"), err)
    assert.equal(1, count_lines(err, want2), err)
    local out = srv:stdout():sub(mark + 1)
    assert.falsy(out:find("roottick v2", 1, true), "the failed VM's timer runs:\n" .. out)
    assert.falsy(out:find("rootsub v2", 1, true), "the failed VM's subscriber runs:\n" .. out)
    assert.falsy(out:find("start %S+ v2"), "the failed VM started:\n" .. out)
    assert.truthy(out:find("roottick v1", 1, true), "the old root VM's timer stopped:\n" .. out)

    -- nothing else was logged: no traceback, no worker replaced
    for _, l in ipairs(H.lines(err)) do
      assert.truthy(plain(l, "reload failed; the old code keeps serving: "),
        "unexpected stderr line: " .. l)
    end

    -- 3. fixed: reloads
    write_app(app, "v3")
    assert.equal(0, kill(app.root, H.SIGHUP))
    local new = wait_rolled(app, "v3")
    for p in pairs(new) do assert.is_nil(set_of(before)[p]) end
    assert.equal(2, count_lines(srv:stderr(), "reload failed"), srv:stderr())
    assert.equal(0, srv:stop())
  end)

  it("--pidfile holds the root's pid (removed at exit); --reload PIDFILE reloads", function()
    local pidfile = H.tmpdir() .. "/moonport.pid"
    local app = start_app { options = { "--pidfile", pidfile } }
    local srv = app.srv
    H.wait_for(function() return H.exists(pidfile) end, H.T(5), "the pid file")
    assert.equal(app.root .. "\n", H.read_file(pidfile))

    write_app(app, "v2")
    local st, out, err = H.run { "--reload", pidfile }
    assert.equal(0, st, err)
    assert.equal("", err)
    assert.truthy(out:find("^moonport: pid " .. app.root .. " reloaded: every worker runs the new code"), out)
    assert.equal(1, #H.lines(out), out)
    srv:wait_stderr("moonport: SIGHUP: reloaded " .. app.path, H.T(5), true)
    -- it returned once the roll was done: every worker started is v2 already
    assert.equal(2 * app.n, #srv:stdout_lines("^start worker "), srv:stdout())
    assert.equal(app.n, #srv:stdout_lines("^start worker v2 "), srv:stdout())
    wait_rolled(app, "v2")

    -- a script that doesn't load: status 1 and the error line; nothing changes
    write_app(app, "v3", "\nthis is not lua\n")
    st, out, err = H.run { "--reload", pidfile }
    assert.equal(1, st, out)
    local line = H.one_line(err)
    assert.truthy(line:find("^moonport: reload failed: .*app%.lua:%d+:"), line)
    assert.equal(app.n, #srv:stdout_lines("^start worker v2 "), srv:stdout())
    assert.equal("v2", (who(app.port)))
    write_app(app, "v2")

    -- no such file: status 1, one line
    local missing = app.dir .. "/nope.pid"
    st, out, err = H.run { "--reload", missing }
    assert.equal(1, st, err)
    assert.equal("", out)
    local l = H.one_line(err)
    assert.truthy(plain(l, "moonport: cannot read " .. missing), l)
    -- a file without a pid
    local junk = app.dir .. "/junk.pid"
    write_file(junk, "hello\n")
    st, out, err = H.run { "--reload", junk }
    assert.equal(1, st, out .. err)
    l = H.one_line(err)
    assert.truthy(plain(l, junk), l)

    assert.equal(0, srv:stop())
    assert.is_false(H.exists(pidfile), "the pid file is still there after the exit")
  end)

  it("a new worker counts as serving once its mp.on(\"start\") handlers returned: --reload returns after them", function()
    -- The new code's start handler takes half a second (a blocking
    -- sleep). The root retires an old worker, and --reload returns, only
    -- when the new workers said they serve: each has printed its line.
    local pidfile = H.tmpdir() .. "/moonport.pid"
    local app = start_app { options = { "--pidfile", pidfile } }
    local srv = app.srv
    H.wait_for(function() return H.exists(pidfile) end, H.T(5), "the pid file")
    local slow = "\nmp.on('start', function()\n" ..
      "  if mp.is_root() then return end\n" ..
      "  os.execute('sleep 0.5')\n" ..
      "  io.write(('slow start done pid=%d\\n'):format(mp.pid())) io.flush()\n" ..
      "end)\n"
    write_app(app, "v2", slow)
    local st, out, err = H.run { "--reload", pidfile }
    assert.equal(0, st, err)
    assert.truthy(out:find("reloaded: every worker runs the new code"), out)
    assert.equal(app.n, #srv:stdout_lines("^slow start done pid="), srv:stdout())
    assert.equal(app.n, #srv:stdout_lines("^start worker v2 "), srv:stdout())
    wait_rolled(app, "v2")
    assert.equal(0, srv:stop())
  end)

  it("--reload and --reopen-logs signal only a moonport server: a pid file naming another program is refused and it lives on; a link planted beside the pid file is not written through", function()
    local dir = H.tmpdir()
    local other = H.spawn { "/bin/sleep", "60" }
    local pf = dir .. "/other.pid"
    write_file(pf, other:pid() .. "\n")
    for _, cmd in ipairs { "--reload", "--reopen-logs" } do
      local st, out, err = H.run { cmd, pf }
      assert.equal(1, st, cmd .. ": " .. out .. err)
      local line = H.one_line(err)
      assert.truthy(plain(line, ("pid %d (from %s) is not a moonport server: it runs /"):format(other:pid(), pf)),
        line)
    end
    assert.is_true(other:alive(), "the program the pid file named got the signal")
    other:kill(H.SIGKILL)

    -- the reload outcome is written through an unpredictable name: a link
    -- planted at the old predictable one points at a file that stays whole
    local pidfile = dir .. "/moonport.pid"
    local app = start_app { options = { "--pidfile", pidfile } }
    H.wait_for(function() return H.exists(pidfile) end, H.T(5), "the pid file")
    local victim = dir .. "/precious"
    write_file(victim, "precious\n")
    assert(lfs.link(victim, ("%s.reload.%d.tmp"):format(pidfile, app.root), true))
    assert(lfs.link(victim, ("%s.%d.tmp"):format(pidfile, app.root), true))
    write_app(app, "v2")
    local st, out, err = H.run { "--reload", pidfile }
    assert.equal(0, st, out .. err)
    assert.equal("precious\n", H.read_file(victim))
    assert.equal("file", lfs.symlinkattributes(pidfile .. ".reload", "mode"))
    assert.equal(0, app.srv:stop())
  end)

  it("--reload on a one-process server (-w 1, no root to roll workers) fails with the reason and status 1; the server goes on", function()
    local pidfile = H.tmpdir() .. "/one.pid"
    local port = H.free_port()
    local srv = H.start("echo.lua", { args = { port }, options = { "-w", "1", "--pidfile", pidfile },
      wait_port = port })
    H.wait_for(function() return H.exists(pidfile) end, H.T(5), "the pid file")
    local st, out, err = H.run { "--reload", pidfile }
    assert.equal(1, st, out)
    assert.truthy(H.one_line(err):find("^moonport: reload failed: reloading needs worker processes"), err)
    local c = H.connect(port)
    assert.equal("hi", H.roundtrip(c, "hi"))
    assert.equal(0, srv:stop())
    assert.is_false(H.exists(pidfile .. ".reload"), "the reload outcome is left behind")
  end)

  it("--watch reloads when a .lua file in the script's folder is saved (once per burst), not for other files", function()
    local app = start_app { options = { "--watch" } }
    local srv = app.srv
    local function reloads() return count_lines(srv:stderr(), "moonport: --watch: reloaded " .. app.path) end

    -- saved the way editors often do: a temp file renamed into place
    local tmp = app.dir .. "/app.lua.tmp"
    write_file(tmp, app_text("v2"))
    assert(os.rename(tmp, app.path))
    local t0 = H.now()
    wait_rolled(app, "v2")
    assert.is_true(H.now() - t0 < H.T(5), ("took %.1fs"):format(H.now() - t0))
    H.sleep(0.5)
    assert.equal(1, reloads(), srv:stderr())

    -- other files in the folder do not count
    write_file(app.dir .. "/notes.txt", "hello\n")
    H.sleep(1)
    assert.equal(1, reloads(), srv:stderr())

    -- plain writes in place, three in a burst: one reload, 300 ms after
    -- the last
    for _ = 1, 3 do
      write_file(app.path, app_text("v3"))
      H.sleep(0.05)
    end
    t0 = H.now()
    wait_rolled(app, "v3")
    assert.is_true(H.now() - t0 < H.T(5), ("took %.1fs"):format(H.now() - t0))
    H.sleep(0.5)
    assert.equal(2, reloads(), srv:stderr())

    -- another .lua file there (a module the script may require) counts
    local old = children(app.root)
    write_file(app.dir .. "/helper.lua", "return {}\n")
    H.wait_for(function() return reloads() == 3 end, H.T(5),
      function() return "a reload for helper.lua: " .. srv:describe() end)
    H.wait_for(function() return #srv:stdout_lines("^start worker v3 ") >= 4 end, H.T(10),
      function() return "the workers replaced again: " .. srv:describe() end)
    H.wait_for(function()
      local kids = children(app.root)
      return #kids == 2 and not set_of(old)[kids[1]] and not set_of(old)[kids[2]]
    end, H.T(5), function() return "new workers only: " .. srv:describe() end)
    assert.falsy(plain(srv:stderr(), "reload failed"), srv:stderr())
    assert.equal(0, srv:stop())
  end)

  it("--watch: a reload that comes while a root-lane timer is due completes", function()
    -- The --watch reload runs from a timer callback (the 300 ms debounce);
    -- with 20 root-lane timers every 1 ms, some are due in the same turn
    -- of the loop and come after it.
    local busy = "\nif mp.is_root() then for _ = 1, 20 do mp.every(1, function() end) end end\n"
    local app = start_app { options = { "--watch" }, extra = busy }
    local srv = app.srv
    write_file(app.path, app_text("v2", busy))
    srv:wait_stderr("moonport: --watch: reloaded " .. app.path, H.T(5), true)
    local ok, err = pcall(srv.wait_stdout, srv, "start root v2 pid=" .. app.root .. "\n", H.T(5), true)
    if not ok then
      -- fields 14 and 15 of /proc/PID/stat: CPU time in user and kernel mode
      local stat = H.read_file("/proc/" .. app.root .. "/stat") or ""
      local ut, st = stat:match("^%d+ %(.-%) %a" .. ("%s+%S+"):rep(10) .. "%s+(%d+)%s+(%d+)")
      error(("the root did not finish the reload (state %s, %s+%s clock ticks of CPU so far): %s")
        :format(tostring(H.proc_stat(app.root)), tostring(ut), tostring(st), tostring(err)), 0)
    end
    wait_rolled(app, "v2")
    assert.equal(0, srv:stop())
  end)

  it("two reloads in quick succession end with every worker on the newest code", function()
    local app = start_app { options = { "--drain-timeout", "2" }, grace = 1 }
    local srv = app.srv
    local before = children(app.root)
    local c = H.connect(app.port)
    assert.truthy(assert(line_rt(c, "who")):match("^v1 "))
    write_app(app, "v2")
    assert.equal(0, kill(app.root, H.SIGHUP))
    srv:wait_stdout("start root v2 ", H.T(5), true)
    write_app(app, "v3")
    assert.equal(0, kill(app.root, H.SIGHUP))
    wait_rolled(app, "v3")
    -- the open connection still works until its worker's drain deadline
    -- (then it is told bye and closed)
    local l, e = line_rt(c, "who")
    assert.truthy(l and (l:match("^v1 ") or l:match("^bye v1 ")) or e == "closed", tostring(l or e))
    H.wait_for(function()
      local kids = children(app.root)
      if #kids ~= 2 then return false end
      for _, k in ipairs(kids) do if set_of(before)[k] then return false end end
      return true
    end, H.T(10), function() return "two workers, all new: " .. srv:describe() end)
    for _ = 1, 10 do assert.equal("v3", (who(app.port))) end
    local err = srv:stderr()
    assert.equal(2, count_lines(err, "moonport: SIGHUP: reloaded"), err)
    assert.falsy(plain(err, "killing it"), err)
    assert.equal(0, srv:stop())
  end)

  it("--watch with -w 1 is a usage error", function()
    local dir = H.tmpdir()
    local path = dir .. "/app.lua"
    write_file(path, app_text("v1"))
    local port = H.free_port()
    local st, out, err = H.run { "-w", "1", "--watch", path, port }
    assert.equal(2, st, err)
    assert.equal("", out)
    local l = H.one_line(err)
    assert.truthy(plain(l, "--watch"), l)
    assert.is_false(H.is_listening(port))
  end)

  it("-w 1: SIGHUP does not reload; the process keeps serving the old code and says why", function()
    local dir = H.tmpdir()
    local path = dir .. "/app.lua"
    write_file(path, app_text("v1"))
    local port = H.free_port()
    local srv = H.start(path, { threads = 1, options = { "-w", "1" }, args = { port },
                                wait_port = port, wait_stdout = "start worker v1" })
    write_file(path, app_text("v2"))
    assert.equal(0, kill(srv:pid(), H.SIGHUP))
    local l = srv:wait_stderr("moonport: [^\n]*SIGHUP[^\n]*", H.T(5))
    assert.truthy(plain(l, "-w 2"), l)
    assert.is_true(srv:alive())
    assert.equal("v1 " .. srv:pid() .. " 1", ask(port, "who"))
    assert.equal(0, srv:stop())
  end)

  it("a SIGHUP sent to a worker is ignored: reloading is the root's", function()
    local app = start_app()
    local srv = app.srv
    local before = children(app.root)
    write_app(app, "v2")
    for _, p in ipairs(before) do assert.equal(0, kill(p, H.SIGHUP)) end
    H.sleep(0.5)
    assert.same(before, children(app.root))
    for _ = 1, 10 do
      local v, pid = who(app.port)
      assert.equal("v1", v, tostring(pid))
      assert.truthy(set_of(before)[pid], "served by pid " .. tostring(pid))
    end
    assert.falsy(plain(srv:stderr(), "reload"), srv:stderr())
    assert.equal(0, srv:stop())
  end)

  it("mp.on('reload') in a replaced worker hands its state to the new one by pub/sub", function()
    local app = start_app()
    local srv = app.srv
    -- hits on fresh connections until both workers have some
    local count, total = {}, 0
    for _ = 1, 300 do
      local l = assert(ask(app.port, "hit"))
      local pid, w, n = l:match("^hit v1 (%d+) (%d+) (%d+)$")
      assert.truthy(pid, l)
      w, n = tonumber(w), tonumber(n)
      assert.equal((count[w] or 0) + 1, n, l)
      count[w] = n
      total = total + 1
      if total >= 20 and count[1] and count[2] then break end
    end
    assert.truthy(count[1] and count[2], "every hit went to one worker: " .. total)
    local old = children(app.root)

    write_app(app, "v2")
    assert.equal(0, kill(app.root, H.SIGHUP))
    wait_rolled(app, "v2")
    -- each new worker got its predecessor's count
    H.wait_for(function() return #srv:stdout_lines("^carried v2 ") >= 2 end, H.T(5),
      function() return "state carried to both new workers: " .. srv:describe() end)
    for w = 1, 2 do
      assert.equal(1, #srv:stdout_lines("^carried v2 w=" .. w .. " pid=%d+ n=" .. count[w] .. "$"),
        srv:stdout())
    end
    for _, p in ipairs(old) do
      assert.equal(1, #srv:stdout_lines("^reload worker v1 pid=" .. p .. " hits=%d+$"), srv:stdout())
    end
    -- and serves it
    local seen = {}
    for _ = 1, 300 do
      local l = assert(ask(app.port, "get"))
      local v, w, n = l:match("^get (%S+) %d+ (%d+) (%d+)$")
      assert.equal("v2", v, l)
      w, n = tonumber(w), tonumber(n)
      assert.equal(count[w], n, "worker " .. w .. " after the reload: " .. l)
      seen[w] = true
      if seen[1] and seen[2] then break end
    end
    assert.truthy(seen[1] and seen[2], "fresh connections reached one worker only")
    assert.equal(0, srv:stop())
  end)

  it("the root lane reloads: its old VM's reload handlers run, its timers and subscriptions end", function()
    local app = start_app()
    local srv = app.srv
    local root = app.root
    assert.equal("ok", ask(app.port, "pub one"))
    srv:wait_stdout("rootsub v1 n=1 msg=one\n", H.T(3), true)
    assert.equal("ok", ask(app.port, "pub two"))
    srv:wait_stdout("rootsub v1 n=2 msg=two\n", H.T(3), true)

    for k, version in ipairs { "v2", "v3" } do
      local prev = k == 1 and "v1" or "v2"
      write_app(app, version)
      assert.equal(0, kill(root, H.SIGHUP))
      srv:wait_stdout("start root " .. version .. " pid=" .. root .. "\n", H.T(5), true)
      local out = srv:stdout()
      -- the new VM loads (mp.is_root() there), then the old one's reload
      -- handlers run, then the new one's start handlers
      local a = out:find("top root " .. version .. " pid=" .. root .. "\n", 1, true)
      local b = out:find("reload root " .. prev .. " pid=" .. root .. " ", 1, true)
      local c = out:find("start root " .. version .. " pid=" .. root .. "\n", 1, true)
      assert.truthy(a and b and c, out)
      assert.is_true(a < b and b < c, "order of top/reload/start:\n" .. out)
      local mark = out:find("\n", b, true)

      local msg = "after-" .. version
      assert.equal("ok", ask(app.port, "pub " .. msg))
      srv:wait_stdout("rootsub " .. version .. " n=1 msg=" .. msg .. "\n", H.T(3), true)
      H.sleep(0.5)
      local after = srv:stdout():sub(mark + 1)
      assert.equal(1, count_lines(after, "msg=" .. msg), "delivered to more than one root VM:\n" .. after)
      assert.falsy(plain(after, "roottick " .. prev), "the old root VM's timer still runs:\n" .. after)
      assert.truthy(plain(after, "roottick " .. version), "the new root VM's timer does not run:\n" .. after)
      wait_rolled(app, version)
    end
    assert.equal(0, srv:stop())
  end)

  it("a long-lived connection does not hold a reload past --drain-timeout", function()
    local app = start_app { options = { "--drain-timeout", "1.5" }, grace = 1 }
    local srv = app.srv
    local c = H.connect(app.port)
    local v, pid = assert(line_rt(c, "who")):match("^(%S+) (%d+) %d+$")
    assert.equal("v1", v)

    write_app(app, "v2")
    assert.equal(0, kill(app.root, H.SIGHUP))
    local t0 = H.now()
    srv:wait_stderr("moonport: SIGHUP: reloaded", H.T(3), true)
    assert.equal("v1 " .. pid, (assert(line_rt(c, "who")):match("^(%S+ %d+)")))
    -- at the drain deadline the old worker closes it (on_shutdown says bye)
    local data, err = H.read_to_eof(c, H.T(8))
    local took = H.now() - t0
    assert.equal("bye v1 " .. pid .. "\n", data, tostring(err))
    assert.is_true(took >= 1.4, ("closed after %.2fs, before the drain deadline"):format(took))
    assert.is_true(took < H.T(5), ("closed after %.2fs"):format(took))
    H.wait_for(function() return not running(tonumber(pid)) end, H.T(3),
      function() return "old worker pid " .. pid .. " to exit: " .. srv:describe() end)
    wait_rolled(app, "v2")
    assert.falsy(plain(srv:stderr(), "killing it"), srv:stderr())
    assert.equal(0, srv:stop())
  end)

  it("under steady load, a reload every 2 s loses no request and refuses no connection", function()
    local app = start_app { options = { "--drain-timeout", "3" }, grace = 1 }
    local srv = app.srv
    local failures, served, eofs, answered = {}, 0, 0, {}
    local function fail(msg)
      if #failures < 20 then failures[#failures + 1] = ("%.2fs: %s"):format(H.now() - app.t0, msg) end
      failures.n = (failures.n or 0) + 1
    end
    app.t0 = H.now()

    -- a few connections that stay open, reconnected when a drained worker
    -- closes them
    local persistent = {}
    local function open_persistent(i)
      local c, err = H.try_connect(app.port, { timeout = H.T(3) })
      if not c then fail("persistent " .. i .. ": connect: " .. tostring(err)) end
      persistent[i] = c
    end
    for i = 1, 3 do open_persistent(i); answered[i] = 0 end

    local version, reloads, versions_seen = 1, 0, {}
    local next_reload = H.now() + 1
    local stop_at = H.now() + 11
    while H.now() < stop_at do
      if H.now() >= next_reload and version < 6 then
        version = version + 1
        write_app(app, "v" .. version)
        assert.equal(0, kill(app.root, H.SIGHUP))
        reloads = reloads + 1
        next_reload = next_reload + 2
      end
      -- a request on a fresh connection
      local v, pid = who(app.port)
      if v then
        served = served + 1
        versions_seen[v] = true
        app.seen[pid] = true
      else
        fail("fresh connection: " .. tostring(pid))
      end
      -- one on each persistent connection
      for i = 1, #persistent do
        local c = persistent[i]
        if c then
          local l, err = line_rt(c, "who")
          if l and l:match("^v%d+ %d+ %d+$") then
            answered[i] = answered[i] + 1
          elseif (l and l:match("^bye ")) or err == "closed" or err == "connection reset by peer" then
            eofs = eofs + 1     -- drained: its worker closed it
            c:close()
            open_persistent(i)
          else
            fail(("persistent %d: %s"):format(i, tostring(l or err)))
            c:close()
            open_persistent(i)
          end
        else
          open_persistent(i)
        end
      end
      H.sleep(0.005)    -- steady, not flat out (ephemeral ports, slow builds)
    end

    io.stderr:write(("# load: served %d, eofs %d, answered %d/%d/%d\n"):format(served, eofs, answered[1], answered[2], answered[3]))
    assert.equal(0, failures.n or 0, "failed requests:\n" .. table.concat(failures, "\n")
      .. "\n" .. srv:describe())
    assert.equal(5, reloads)
    assert.is_true(served > 100, "too few requests served: " .. served)
    for i = 1, 3 do
      assert.is_true(answered[i] > 50, ("persistent connection %d answered %d times"):format(i, answered[i]))
    end
    for k = 1, 6 do
      assert.truthy(versions_seen["v" .. k], "no fresh connection was served by v" .. k)
    end
    wait_rolled(app, "v6")
    local err = srv:stderr()
    assert.equal(5, count_lines(err, "moonport: SIGHUP: reloaded"), err)
    assert.falsy(plain(err, "reload failed"), err)
    assert.falsy(plain(err, "killing it"), err)
    -- the drained workers are gone, the new ones serve
    H.wait_for(function() return #children(app.root) == 2 end, H.T(8),
      function() return "two workers left: " .. srv:describe() end)
    assert.equal(0, srv:stop())
  end)
end)
