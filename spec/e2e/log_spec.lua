-- Spec: moonport's own log. Every line has one fixed format (time, level,
-- process, pid, source), mp.log writes a script's lines into it,
-- --log-level / MOONPORT_LOG_LEVEL choose what is printed, one line at
-- start says what is served, and the access log (--log) and the error log
-- (--error-log) are reopened on SIGWINCH / `moonport --reopen-logs
-- PIDFILE` without losing a line (logrotate).
local H = require "spec.helper"
local ffi = require "ffi" -- kill(2) is declared by spec/helper.lua

local start, cleanup = H.fixture_servers("log_app.lua")
local SIGWINCH = 28

-- One request on a fresh connection (so -w 2 spreads them over the
-- workers); returns the body.
local function get(port, path)
  local c = H.connect(port)
  assert(H.send(c, "GET " .. path .. " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
  local data, err = H.read_to_eof(c, H.T(5))
  c:close()
  assert(data, err)
  assert.truthy(data:find("^HTTP/1.1 200"), data)
  return data:match("\r\n\r\n(.*)$")
end

local function utc(t) return os.date("!%Y-%m-%dT%H:%M:%S", t) end

-- Checks every line of `text` is a log line and returns them parsed.
local function parsed_lines(text)
  local out = {}
  for _, l in ipairs(H.lines(text)) do
    local f = H.log_fields(l)
    assert.truthy(f, "not in the log format: " .. l .. "\n" .. text)
    out[#out + 1] = f
  end
  return out
end

describe("the log", function()
  after_each(cleanup)

  it("every line of -w 2 carries UTC time, level, process and pid in one format", function()
    local before = utc(os.time() - 1)
    local srv, port = start({}, { workers = 2, options = { "--log-level", "debug" } })
    H.wait_for(function() return #H.children(srv:pid()) == 2 end, H.T(5), "two workers")
    local workers = {}
    for i, pid in ipairs(H.children(srv:pid())) do workers[pid] = true end
    for i = 1, 6 do assert.equal("ok", get(port, "/log?level=warn&msg=m" .. i)) end
    assert.equal(0, srv:stop())
    local after = utc(os.time() + 1)
    local raw = srv:raw_stderr()
    local lines = parsed_lines(raw)
    assert.is_true(#lines >= 10, raw)
    local who = {}
    for _, f in ipairs(lines) do
      assert.truthy(f.time:sub(1, 19) >= before and f.time:sub(1, 19) <= after, f.time)
      if f.worker == "root" then
        assert.equal(srv:pid(), f.pid, raw)
      else
        assert.truthy(f.worker == "w1" or f.worker == "w2", f.worker)
        assert.is_true(workers[f.pid] or false, "pid " .. f.pid .. " is no worker:\n" .. raw)
      end
      who[f.worker] = true
      assert.truthy(f.source == "moonport" or f.source == "lua", f.source)
    end
    assert.is_true(who.root and who.w1 and who.w2, raw)
    -- the script's lines: source "lua", the values joined by spaces
    local n = 0
    for _, f in ipairs(lines) do
      if f.source == "lua" then
        n = n + 1
        assert.equal("warn", f.level)
        assert.truthy(f.message:match("^m%d 42 true$"), f.message)
      end
    end
    assert.equal(6, n, raw)
    -- the stripped form the other specs match
    assert.truthy(srv:stderr():find("\nlua: m1 42 true\n", 1, true), srv:stderr())
  end)

  it("--log-level and MOONPORT_LOG_LEVEL choose the levels printed (the command line wins); mp.log checks its level", function()
    local levels = { "error", "warn", "info", "debug" }
    local function logged(srv, port)
      for _, l in ipairs(levels) do assert.equal("ok", get(port, "/log?level=" .. l .. "&msg=at-" .. l)) end
      local got = {}
      H.wait_for(function()
        return srv:raw_stderr():find("at-error", 1, true)
      end, H.T(3), "the error line")
      for _, f in ipairs(parsed_lines(srv:raw_stderr())) do
        if f.source == "lua" then
          assert.equal("at-" .. f.level .. " 42 true", f.message)
          got[#got + 1] = f.level
        end
      end
      return table.concat(got, " ")
    end
    local cases = {
      { {}, nil, "error warn" },
      { { "--log-level", "error" }, nil, "error" },
      { { "--log-level=debug" }, nil, "error warn info debug" },
      { {}, { MOONPORT_LOG_LEVEL = "info" }, "error warn info" },
      { { "--log-level", "warn" }, { MOONPORT_LOG_LEVEL = "debug" }, "error warn" },
      { { "-v" }, nil, "error warn info" },
    }
    for _, case in ipairs(cases) do
      local srv, port = start({}, { workers = 1, options = case[1], env = case[2] })
      assert.equal(case[3], logged(srv, port), table.concat(case[1], " "))
      if case[3] == "error warn" then
        assert.equal("false bad argument #1 to '?' (level must be \"error\", \"warn\", \"info\" or \"debug\")",
          (get(port, "/badlevel"):gsub("'log'", "'?'")))
      end
      assert.equal(0, srv:stop())
    end
    for _, case in ipairs {
      { { "--log-level", "loud", "x.lua" }, nil, "moonport: --log-level must be error, warn, info or debug, not 'loud' (see moonport --help)" },
      { { "x.lua" }, { MOONPORT_LOG_LEVEL = "2" }, "moonport: MOONPORT_LOG_LEVEL must be error, warn, info or debug, not '2' (see moonport --help)" },
      { { "--log-level" }, nil, "moonport: --log-level needs a level (error, warn, info, debug) (see moonport --help)" },
    } do
      local st, _, err = H.run(case[1], { env = case[2] })
      assert.equal(2, st)
      assert.equal(case[3], H.one_line(err))
    end
  end)

  it("one line at start says what is served: version, script, every listener as a URL, workers x lanes", function()
    local dir = H.tmpdir()
    local path = dir .. "/s.sock"
    local srv, port = start({ path }, { workers = 2, threads = 2, options = { "--log-level", "info" } })
    local want = ("moonport: version %s serving %s on http://0.0.0.0:%d, http+unix:%s; 2 workers x 2 lanes")
      :format("0.1.0", H.fixture("log_app.lua"), port, path)
    srv:wait_stderr(want, H.T(5), true)
    assert.equal(1, H.count_lines(srv:stderr(), "serving"), srv:stderr())
    local _, ver = H.run({ "--version" })
    assert.equal("moonport 0.1.0\n", ver)
    assert.equal(0, srv:stop())
    -- one process, one lane; the echo example listens on raw TCP
    local one, p1 = start({}, { workers = 1, threads = 1, options = { "-v" } })
    one:wait_stderr(("moonport: version 0.1.0 serving %s on http://0.0.0.0:%d; 1 worker x 1 lane")
      :format(H.fixture("log_app.lua"), p1), H.T(5), true)
    assert.equal(0, one:stop())
    local p2 = H.free_port()
    local echo = H.start(H.root .. "/examples/echo.lua", { args = { p2 }, wait_port = p2, threads = 1,
      options = { "-w", "1", "--log-level", "info" } })
    echo:wait_stderr("serving " .. H.root .. "/examples/echo.lua on tcp://127.0.0.1:" .. p2 .. "; 1 worker x 1 lane",
      H.T(5), true)
    assert.equal(0, echo:stop())
  end)
end)

describe("reopening the logs", function()
  after_each(cleanup)

  -- Sends requests /count?n=1.. on fresh connections while `during` runs
  -- between request `at` and the end; returns how many were sent.
  local function load(port, total, at, during)
    for n = 1, total do
      assert.equal("ok", get(port, "/count?n=" .. n))
      if n == at then during() end
    end
    return total
  end

  local function access_ns(text)
    local ns = {}
    for _, l in ipairs(H.lines(text or "")) do
      local n = l:match('"GET /count%?n=(%d+) HTTP/1.1"')
      if n then ns[#ns + 1] = tonumber(n) end
    end
    return ns
  end

  local function error_ns(text, workers)
    local ns = {}
    for _, l in ipairs(H.lines(text or "")) do
      local f = H.log_fields(l)
      local n = f and f.source == "lua" and f.message:match("^request (%d+)$")
      if n then
        ns[#ns + 1] = tonumber(n)
        if workers then workers[f.worker] = true end
      end
    end
    return ns
  end

  -- Every n in 1..total exactly once over both lists.
  local function each_once(a, b, total, what)
    local seen = {}
    for _, list in ipairs { a, b } do
      for _, n in ipairs(list) do
        assert.is_nil(seen[n], what .. ": request " .. n .. " logged twice")
        seen[n] = true
      end
    end
    for n = 1, total do assert.is_true(seen[n] or false, what .. ": request " .. n .. " lost") end
  end

  for _, w in ipairs { 2, 1 } do
    it(("-w %d: after the files are moved, --reopen-logs (SIGWINCH) puts new lines in new files; none is lost"):format(w), function()
      local dir = H.tmpdir()
      local access, errlog, pidfile = dir .. "/access.log", dir .. "/error.log", dir .. "/moonport.pid"
      local srv, port = start({}, { workers = w, options = {
        "--log", access, "--error-log", errlog, "--pidfile", pidfile } })
      H.wait_for(function() return H.exists(pidfile) end, H.T(5), "the pid file")
      local total = 400
      load(port, total, 150, function()
        assert(os.rename(access, access .. ".1"))
        assert(os.rename(errlog, errlog .. ".1"))
        if w == 1 then
          assert.equal(0, ffi.C.kill(srv:pid(), SIGWINCH))
        else
          local st, out, err = H.run({ "--reopen-logs", pidfile })
          assert.equal(0, st, err)
          assert.equal("", out .. err)
        end
      end)
      -- the last responses may be sent just before their lines are written
      H.wait_for(function()
        return #access_ns(H.read_file(access .. ".1")) + #access_ns(H.read_file(access)) >= total
          and #error_ns(H.read_file(errlog .. ".1")) + #error_ns(H.read_file(errlog)) >= total
      end, H.T(5), function() return "every line:\n" .. srv:describe() end)
      local old_a, new_a = access_ns(H.read_file(access .. ".1")), access_ns(H.read_file(access))
      local workers = {}
      local old_e, new_e = error_ns(H.read_file(errlog .. ".1")), error_ns(H.read_file(errlog), workers)
      each_once(old_a, new_a, total, "access log")
      each_once(old_e, new_e, total, "error log")
      assert.is_true(#old_a >= 150 and #new_a > 0, #old_a .. " / " .. #new_a)
      assert.is_true(#old_e >= 150 and #new_e > 0, #old_e .. " / " .. #new_e)
      -- every worker writes to the new files
      if w == 2 then assert.is_true(workers.w1 and workers.w2 or false, H.read_file(errlog)) end
      -- the error log holds the server's own lines too, nothing is on stderr
      assert.equal(0, srv:stop())
      assert.equal("", srv:raw_stderr())
      local all = (H.read_file(errlog .. ".1") or "") .. (H.read_file(errlog) or "")
      parsed_lines(all)
    end)
  end

  it("--reopen-logs without a server says why and exits 1", function()
    local dir = H.tmpdir()
    local st, _, err = H.run({ "--reopen-logs", dir .. "/none.pid" })
    assert.equal(1, st)
    assert.equal(1, H.one_line(err):find("moonport: cannot read " .. dir .. "/none.pid", 1, true), err)
  end)
end)
