-- Spec: the frictions a new user hit on a web app's first day (issue 29),
-- each through the real binary: math.random seeded per lane, relative
-- public= and tls= names found from the script's folder (mp.script_dir)
-- when started from /, the https:// start line, restarts counted by
-- cause, a routine reload logged at info, mp.json.encode leaving "/"
-- alone, and res:header naming itself in its errors. The server is
-- spec/fixtures/frictions_app.lua.
local H = require "spec.helper"
local cjson = require "cjson"
local ffi = require "ffi" -- kill(2) is declared by spec/helper.lua
local lfs = require "lfs"

local start, cleanup, track = H.fixture_servers("frictions_app.lua")
local CURL = "/usr/bin/curl"

local function curl(args)
  local argv = { CURL, "-sS", "--noproxy", "*", "--max-time", H.T(10) }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local st, out, err = H.exec(argv)
  assert.equal(0, st, err)
  return out
end

-- { name{labels} = value } of the status endpoint's Prometheus text.
local function metrics(port)
  local m = {}
  for line in curl { "http://127.0.0.1:" .. port .. "/metrics" }:gmatch("[^\n]+") do
    if line:sub(1, 1) ~= "#" then
      local k, v = line:match("^(%S+) (%S+)$")
      m[k] = tonumber(v)
    end
  end
  return m
end

local function restarts(m, cause) return m[('moonport_worker_restarts_total{cause="%s"}'):format(cause)] end

-- A copy of the fixture in a fresh folder, with pub/hi.txt and (given a
-- test CA) cert.pem and key.pem beside it. Returns the folder.
local function app_dir(ca)
  local dir = H.tmpdir()
  H.write_file(dir .. "/app.lua", assert(H.read_file(H.fixture("frictions_app.lua"))))
  assert(lfs.mkdir(dir .. "/pub"))
  H.write_file(dir .. "/pub/hi.txt", "hello from pub\n")
  if ca then
    H.write_file(dir .. "/cert.pem", assert(H.read_file(ca.localhost.cert)))
    H.write_file(dir .. "/key.pem", assert(H.read_file(ca.localhost.key)))
  end
  return dir
end

-- moonport started with `cwd` as its working directory (the shell execs
-- it: the pid is moonport's); waits for the port.
local function start_in(cwd, script, port, args, options)
  local argv = { "/bin/sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cwd, H.bin }
  for _, o in ipairs(options or {}) do argv[#argv + 1] = o end
  argv[#argv + 1] = script
  argv[#argv + 1] = tostring(port)
  for _, a in ipairs(args or {}) do argv[#argv + 1] = a end
  local srv = track(H.spawn(argv))
  H.wait_for(function()
    if not srv:alive() then error("exited: " .. srv:describe(), 0) end
    return srv:listens_on(port)
  end, H.T(10), function() return srv:describe() end)
  return srv
end

describe("frictions", function()
  after_each(cleanup)

  it("math.random starts from the OS in every lane: the root and 2 workers x 2 lanes draw five different numbers", function()
    local srv = start({}, { workers = 2, threads = 2 })
    local draws
    H.wait_for(function()
      draws = srv:stdout_lines("^rand ")
      return #draws == 5
    end, H.T(10), function() return "five lanes loaded: " .. srv:describe() end)
    local seen, lanes = {}, {}
    for _, l in ipairs(draws) do
      local pid, lane, root, v = l:match("^rand (%d+) (%d+) (%a+) (%S+)$")
      assert.truthy(v, l)
      assert.is_nil(seen[v], "two lanes drew " .. v .. ":\n" .. table.concat(draws, "\n"))
      seen[v] = true
      lanes[pid .. "/" .. lane] = root
    end
    local n = 0
    for _ in pairs(lanes) do n = n + 1 end
    assert.equal(5, n)
    assert.equal(0, srv:stop())
  end)

  it("started from /, relative public= and tls= names are the script's folder's (mp.script_dir); the start line says https://", function()
    local ca = H.test_ca { "localhost" }
    local dir = app_dir(ca)
    local real = select(2, H.exec({ "/usr/bin/realpath", dir })):match("^(.-)\n?$")
    local port = H.free_port()
    local srv = start_in("/", dir .. "/app.lua", port, { cjson.encode { cert = "cert.pem", key = "key.pem" } },
      { "-w", "1", "-t", "1", "--log-level", "info" })
    local base = ("https://localhost:%d"):format(port)
    local tls = { "--cacert", ca.ca, "--resolve", "localhost:" .. port .. ":127.0.0.1" }
    local function get(path)
      local a = { unpack(tls) }
      a[#a + 1] = base .. path
      return curl(a)
    end
    assert.equal("hello from pub\n", get("/hi.txt"), srv:describe())
    assert.equal(real, get("/dir"))
    srv:wait_stderr(("serving %s/app.lua on https://0.0.0.0:%d; 1 worker x 1 lane"):format(dir, port), H.T(5), true)
    assert.equal(0, srv:stop())

    -- a relative script name, from its own folder: the folder is absolute
    local p2 = H.free_port()
    local plain = start_in(dir, "app.lua", p2, {}, { "-w", "1", "-t", "1", "--log-level", "info" })
    assert.equal(real, curl { ("http://127.0.0.1:%d/dir"):format(p2) })
    assert.equal("hello from pub\n", curl { ("http://127.0.0.1:%d/hi.txt"):format(p2) })
    plain:wait_stderr(("on http://0.0.0.0:%d;"):format(p2), H.T(5), true)
    assert.equal(0, plain:stop())

    -- a missing relative file is named with the folder it was looked for in
    local p3 = H.free_port()
    local bad = track(H.spawn({ "/bin/sh", "-c", 'cd / && exec "$@"', "sh", H.bin, "-w", "1",
      dir .. "/app.lua", tostring(p3), cjson.encode { cert = "nope.pem", key = "key.pem" } }))
    assert.equal(1, (bad:wait_exit(H.T(10))))
    assert.truthy(H.plain(bad:stderr(), real .. "/nope.pem") or H.plain(bad:stderr(), dir .. "/nope.pem"), bad:stderr())
  end)

  it("worker restarts are counted by cause: crash, watchdog, memory, reload and restart apart", function()
    local srv, port = start({}, { workers = 2, threads = 1, options = {
      "--lua-timeout", "1", "--max-memory", "60", "--drain-timeout", "1" } })
    local root = srv:pid()
    local function serving() return #H.children(root) == 2 end
    H.wait_for(serving, H.T(10), "two workers")
    local function counts()
      local m = metrics(port)
      return { crash = restarts(m, "crash"), watchdog = restarts(m, "watchdog"), memory = restarts(m, "memory"),
        reload = restarts(m, "reload"), restart = restarts(m, "restart") }
    end
    local function wait_counts(want, what)
      H.wait_for(function() return serving() and H.plain(cjson.encode(counts()), cjson.encode(want)) end,
        H.T(20), function() return what .. ": " .. cjson.encode(counts()) .. "\n" .. srv:describe() end, 0.05)
    end
    -- the workers `old` named are all gone, and two others serve: a count
    -- moves when a replacement starts, while the worker it replaces may
    -- still take a connection (a /spin sent then reached a draining
    -- worker, whose drain deadline killed it before the watchdog could)
    local function replaced(old, what)
      H.wait_for(function()
        local now = H.children(root)
        if #now ~= 2 then return false end
        for _, p in ipairs(now) do
          for _, q in ipairs(old) do if p == q then return false end end
        end
        return true
      end, H.T(20), function() return what .. ": " .. cjson.encode(H.children(root)) end)
    end
    wait_counts({ crash = 0, watchdog = 0, memory = 0, reload = 0, restart = 0 }, "none at start")
    -- a crash
    ffi.C.kill(H.children(root)[1], H.SIGKILL)
    wait_counts({ crash = 1, watchdog = 0, memory = 0, reload = 0, restart = 0 }, "a crash")
    -- a reload replaces both
    local old = H.children(root)
    assert.equal(0, ffi.C.kill(root, H.SIGHUP))
    wait_counts({ crash = 1, watchdog = 0, memory = 0, reload = 2, restart = 0 }, "a reload")
    replaced(old, "the reload's old workers gone")
    -- SIGUSR1: a rolling restart
    old = H.children(root)
    assert.equal(0, ffi.C.kill(root, 10 --[[ SIGUSR1 ]]))
    wait_counts({ crash = 1, watchdog = 0, memory = 0, reload = 2, restart = 2 }, "a rolling restart")
    replaced(old, "the restart's old workers gone")
    -- a stuck lane: the watchdog
    local c = H.connect(port)
    assert(H.send(c, "GET /spin HTTP/1.1\r\nHost: x\r\n\r\n"))
    wait_counts({ crash = 1, watchdog = 1, memory = 0, reload = 2, restart = 2 }, "a stuck worker")
    c:close()
    -- a worker over --max-memory
    -- (the answer may not come: the worker can pass the limit, be replaced
    -- and drained before it finishes the request, on a slow build)
    H.exec({ CURL, "-s", "--max-time", H.T(10), ("http://127.0.0.1:%d/bloat?mb=80"):format(port) })
    wait_counts({ crash = 1, watchdog = 1, memory = 1, reload = 2, restart = 2 }, "a bloated worker")
    assert.equal(0, srv:stop())
  end)

  it("a routine reload logs at info: nothing at warn by default, the lines with -v", function()
    for _, verbose in ipairs { false, true } do
      local srv, port = start({}, { workers = 2, threads = 1, options = verbose and { "-v" } or nil })
      H.wait_for(function() return #H.children(srv:pid()) == 2 end, H.T(10), "two workers")
      assert.equal(0, ffi.C.kill(srv:pid(), H.SIGHUP))
      -- (a scrape that fails mid-roll is retried: refusals are reload_spec's)
      H.wait_for(function()
        local ok, m = pcall(metrics, port)
        return ok and restarts(m, "reload") == 2 and #H.children(srv:pid()) == 2
      end,
        H.T(20), function() return "the reload done: " .. srv:describe() end)
      local levels = {}
      for _, l in ipairs(H.lines(srv:raw_stderr())) do
        local f = H.log_fields(l)
        if f and f.level ~= "info" and f.level ~= "debug" then levels[#levels + 1] = l end
      end
      assert.same({}, levels)
      if verbose then
        local err = srv:stderr()
        assert.truthy(H.plain(err, "SIGHUP: reloaded "), err)
        assert.equal(2, H.count_lines(err, ": reload; starting its replacement"), err)
      end
      assert.equal(0, srv:stop())
    end
  end)

  it("contrib/moonport.service runs in the script's folder and reads a root-only TLS key through LoadCredential=; systemd-analyze verify takes it", function()
    local unit = assert(H.read_file(H.root .. "/contrib/moonport.service"))
    local script = unit:match("\nExecStart=[^\n]* (/%S+%.lua)\n")
    assert.truthy(script, "ExecStart names a script")
    assert.equal(script:match("^(.*)/[^/]*$"), unit:match("\nWorkingDirectory=(%S+)\n"))
    assert.truthy(unit:find("\n#LoadCredential=site.key:/etc/ssl/private/site.key\n", 1, true))
    assert.truthy(unit:find('os.getenv("CREDENTIALS_DIRECTORY") .. "/site.key"', 1, true))
    -- the unit as a user would enable it: this binary, the credential on
    local dir = H.tmpdir()
    H.write_file(dir .. "/moonport.service", (unit:gsub("/usr/bin/moonport", H.bin):gsub("\n#LoadCredential=", "\nLoadCredential=")))
    local st, out, err = H.exec({ "/usr/bin/systemd-analyze", "verify", "--man=no", dir .. "/moonport.service" })
    assert.equal(0, st, out .. err)
    assert.equal("", err)
    -- a misspelt key is caught the same way (the check can fail)
    H.write_file(dir .. "/moonport.service", (unit:gsub("/usr/bin/moonport", H.bin):gsub("\n#LoadCredential=", "\nLoadCredentia=")))
    local st2, _, err2 = H.exec({ "/usr/bin/systemd-analyze", "verify", "--man=no", dir .. "/moonport.service" })
    assert.equal(0, st2)
    assert.truthy(err2:find("Unknown key 'LoadCredentia'", 1, true), err2)
  end)

  it("mp.redis takes unix:///path; a top-level client connects lazily, per lane, never from the root", function()
    local dir = H.tmpdir()
    local sock = dir .. "/redis.sock"
    local redis = track(H.spawn({ "/usr/bin/redis-server", "--port", "0", "--unixsocket", sock,
      "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", dir, "--loglevel", "warning" }))
    local function cli(...)
      local st, out, err = H.exec({ "/usr/bin/redis-cli", "-s", sock, ... })
      return st == 0 and out or nil, err
    end
    H.wait_for(function() return cli("PING") == "PONG\n" end, H.T(10), function() return redis:describe() end)
    -- clients connected, not counting redis-cli itself
    local function clients()
      local out = assert(cli("CLIENT", "LIST"))
      local n = 0
      for l in out:gmatch("[^\n]+") do if not l:find("cmd=client", 1, true) then n = n + 1 end end
      return n
    end
    local port = H.free_port()
    local srv = track(H.start("redis_lazy_app.lua", { args = { port, "unix://" .. sock }, threads = 2,
      options = { "-w", "2" }, wait_port = port }))
    H.wait_for(function() return #H.children(srv:pid()) == 2 end, H.T(10), "two workers")
    assert.equal("ok", curl { ("http://127.0.0.1:%d/"):format(port) })
    -- the root and 2 workers x 2 lanes ran the top level: nobody connected
    assert.equal(0, clients())
    -- each request's lane connects once and keeps it
    local seen = 0
    for i = 1, 30 do
      assert.equal(tostring(i), curl { ("http://127.0.0.1:%d/incr"):format(port) })
      seen = clients()
    end
    assert.is_true(seen >= 1 and seen <= 4, "clients: " .. seen) -- at most one per worker lane
    assert.equal("30\n", (cli("GET", "n")))
    assert.equal(0, srv:stop())
    -- a bad unix:// URL raises with the reason
    local st, _, err = H.run({ "-w", "1", H.fixture("redis_lazy_app.lua"), H.free_port(), "unix://relative.sock" })
    assert.equal(1, st)
    assert.truthy(err:find("needs an absolute path", 1, true), err)
  end)

  it("moonport --check: loads without listening (a port in use is fine, no socket file), warns about undefined globals with file:line, exits 0 or 1", function()
    local holder, port = start({}, { workers = 1, threads = 1 }) -- the port is taken
    local dir = H.tmpdir()
    local sock = dir .. "/s.sock"
    local st, out, err = H.run({ "--check", H.fixture("check_app.lua"), port, sock })
    assert.equal(0, st, err)
    assert.equal("", out)
    assert.equal("moonport: " .. H.fixture("check_app.lua") .. ": ok\n", err)
    assert.is_false(H.exists(sock))
    assert.equal("ok", curl { ("http://127.0.0.1:%d/"):format(port) }) -- the holder still serves
    -- a typo in a handler: two warnings with the line, status 1
    st, out, err = H.run({ "--check", H.fixture("check_typo.lua"), port })
    assert.equal(1, st)
    assert.equal("", out)
    local line = H.fixture_line("check_typo.lua", "reqest.path")
    assert.equal(table.concat({
      ("check_typo.lua:%d: undefined global 'reqest' (nothing in the script or the libraries defines it)"):format(line),
      ("check_typo.lua:%d: undefined global 'strin' (nothing in the script or the libraries defines it)"):format(line),
      "moonport: " .. H.fixture("check_typo.lua") .. ": 2 warnings", "" }, "\n"), err)
    -- a top level that fails: its error, status 1
    local st3, _, err3 = H.run({ "--check", H.fixture("check_app.lua"), port, "-", "fail" })
    assert.equal(1, st3)
    assert.truthy(H.plain(err3, "on_request"), err3)
    assert.truthy(H.plain(err3, ": the script does not load"), err3)
    assert.equal(0, holder:stop())
  end)

  it("moonport --check also checks the modules the script requires from its own folder (at the top level or in a function), not the libraries", function()
    local fix = H.fixtures .. "/check_mods/"
    local app = fix .. "app.lua"
    local port = H.free_port()
    local st, out, err = H.run({ "--check", app, port })
    assert.equal(1, st)
    assert.equal("", out)
    local function line(file, text)
      local n = 0
      for l in io.lines(fix .. file) do
        n = n + 1
        if l:find(text, 1, true) then return n end
      end
      error("no " .. text .. " in " .. file)
    end
    assert.equal(table.concat({
      ("helpers.lua:%d: undefined global 'tostrin' (nothing in the script or the libraries defines it)")
        :format(line("helpers.lua", "tostrin(")),
      ("lib/lazy.lua:%d: undefined global 'tow' (nothing in the script or the libraries defines it)")
        :format(line("lib/lazy.lua", "* tow")),
      "moonport: " .. app .. " (with helpers.lua, lib/lazy.lua): 2 warnings", "" }, "\n"), err)
    -- fixed, it passes; a module that doesn't load is a warning too
    local dir = H.tmpdir()
    lfs.mkdir(dir .. "/lib")
    H.write_file(dir .. "/app.lua", H.read_file(app))
    H.write_file(dir .. "/helpers.lua", (H.read_file(fix .. "helpers.lua"):gsub("tostrin%(", "tostring(")))
    H.write_file(dir .. "/lib/lazy.lua", "return { twice = function(n) return n * 2 end }\n")
    st, out, err = H.run({ "--check", dir .. "/app.lua", port })
    assert.equal(0, st, err)
    assert.equal("", out)
    assert.equal("moonport: " .. dir .. "/app.lua (with helpers.lua, lib/lazy.lua): ok\n", err)
    H.write_file(dir .. "/lib/lazy.lua", "return {\n")
    st, out, err = H.run({ "--check", dir .. "/app.lua", port })
    assert.equal(1, st)
    assert.equal("", out)
    assert.truthy(err:find("^lib/lazy%.lua: does not load: [^\n]*lazy%.lua:2: unexpected symbol"), err)
    assert.truthy(H.plain(err, "(with helpers.lua, lib/lazy.lua): 1 warning\n"), err)
  end)

  it("during a graceful stop a new connection is refused at once, not left in a backlog to be reset; the one in flight finishes", function()
    for _, w in ipairs { 1, 2 } do
      local srv, port = start({}, { workers = w, threads = 1, options = { "-v" } })
      local c = H.connect(port)
      assert(H.send(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"))
      srv:wait_stdout("holding %d+", H.T(10))
      assert.equal(0, ffi.C.kill(srv:pid(), H.SIGTERM))
      srv:wait_stderr(w == 1 and "SIGTERM: shutting down gracefully" or "SIGTERM: stopping the workers", H.T(10), true)
      for _ = 1, 3 do
        local c2, err = H.try_connect(port, { timeout = H.T(5) })
        if c2 then
          -- before: the kernel completed the handshake; the reset came later
          local got, rerr = H.read_to_eof(c2, H.T(10))
          error(("-w %d: a connection during the drain was accepted into the backlog (then: %s %s)")
            :format(w, tostring(got), tostring(rerr)))
        end
        assert.equal("connection refused", err)
      end
      local data = assert(H.read_to_eof(c, H.T(15)))
      assert.truthy(data:find("\r\n\r\nheld$"), data)
      assert.equal(0, (srv:wait_exit(H.T(15))))
      assert.falsy(H.plain(srv:stderr(), "accept failed"), srv:stderr())
    end
  end)

  it("the docs' code blocks all close (a heading never lands inside one), and API.md's title is the whole API's", function()
    for _, doc in ipairs { "docs/API.md", "docs/GUIDE.md", "docs/ARCHITECTURE.md", "README.md" } do
      local open_at, lang, n = nil, nil, 0
      for line in io.lines(H.root .. "/" .. doc) do
        n = n + 1
        local fence, tag = line:match("^(```+)(%S*)%s*$")
        if fence and not open_at then
          open_at, lang = n, tag
        elseif fence then
          assert.equal("", tag, ("%s:%d: a fence with a language inside the block opened at line %d")
            :format(doc, n, open_at))
          open_at = nil
        elseif open_at and lang ~= "sh" and lang ~= "" and line:find("^#+ %u") then
          error(("%s:%d: a heading inside the %s block opened at line %d"):format(doc, n, lang, open_at))
        end
      end
      assert.is_nil(open_at, doc .. ": the block opened at line " .. tostring(open_at) .. " never closes")
    end
    local title = io.lines(H.root .. "/docs/API.md")()
    assert.equal("# moonport Lua API", title)
  end)

  it("mp.json.encode leaves / alone (and a backslash before it still round-trips)", function()
    local _, port = start({}, { workers = 1, threads = 1 })
    local body = curl { ("http://127.0.0.1:%d/json"):format(port) }
    assert.falsy(H.plain(body, "http:\\/"), body)
    local v = cjson.decode(body)
    assert.same({ url = "http://x.example/a/b", back = "a\\/b\\", list = { "/" } }, v)
    assert.truthy(H.plain(body, '"url":"http://x.example/a/b"'), body)
    assert.truthy(H.plain(body, '"back":"a\\\\/b\\\\"'), body)
    assert.truthy(H.plain(body, '["/"]'), body)
  end)

  it("a bad argument to res:header names res:header and the caller's line, called as a method or not", function()
    local _, port = start({}, { workers = 1, threads = 1 })
    local v = cjson.decode(curl { ("http://127.0.0.1:%d/header_bad"):format(port) })
    local line = H.fixture_line("frictions_app.lua", 'res:header("X-A", {})')
    assert.equal(("frictions_app.lua:%d: bad argument #2 to 'res:header' (string expected, got table)"):format(line),
      v.method:match("[^/]*$"))
    assert.truthy(v.plain:find("bad argument #2 to 'res:header' (string expected, got no value)", 1, true), v.plain)
    assert.truthy(v.name:find("bad argument #1 to 'res:header' (not a valid header name)", 1, true), v.name)
  end)
end)
