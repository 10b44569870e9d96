-- Regressions from the code review fixed in 5112ab7: each test fails on the
-- old behaviour (a crash, a sanitizer report, a hang, a wrong result) and
-- passes on the fix. Fixtures: spec/fixtures/reg_*.lua.
local H = require "spec.helper"
local ffi = require "ffi"
local bit = require "bit"

-- Lines of srv's stdout matching pat, as lists of captures.
local function matches(srv, pat)
  local t = {}
  for _, l in ipairs(srv:stdout_lines()) do
    local caps = { l:match(pat) }
    if caps[1] then t[#t + 1] = caps end
  end
  return t
end

-- No line of stderr is an error report (the log prefixes "error" lines).
local function assert_no_errors(srv)
  local err = srv:stderr()
  assert.is_nil(err:lower():find("error", 1, true), "errors on stderr:\n" .. err)
end

-- A client that never hears back: the peer is gone (EOF or reset).
local function assert_dropped(c, what)
  local data, err = H.read_to_eof(c, H.T(3))
  assert.truthy(data, what .. ": still connected (" .. tostring(err) .. ")")
  assert.equal("", data, what .. " got an answer")
end

describe("regressions", function()
  after_each(H.cleanup)

  describe("l:close() inside the listener's own callbacks", function()
    local function start(mode)
      local port, ctl = H.free_port(), H.free_port()
      -- one lane: l:close() stops accepting in this lane only
      local srv = H.start("reg_lclose.lua", {
        args = { port, ctl, mode }, wait_port = ctl, threads = 1,
      })
      assert.is_true(srv:listens_on(port))
      return srv, port, ctl
    end

    it("from on_open: the accepted connection works, later ones are refused", function()
      local srv, port, ctl = start("open")
      local control = H.connect(ctl)
      -- keep the lane busy while three clients complete their handshakes,
      -- so that one accept round finds all three waiting
      assert.is_true(H.send(control, "block 400\n"))
      H.sleep(0.1)
      local c = {}
      for i = 1, 3 do
        c[i] = H.connect(port)
        assert.is_true(H.send(c[i], "c" .. i))
      end
      assert.equal("blocked", H.read_line(control, H.T(3)))
      assert.equal("c1", H.read_exact(c[1], 2, H.T(3)))
      srv:wait_stdout("listener closed", nil, true)
      H.wait_for(function() return not srv:listens_on(port) end, H.T(3), "listener to close")
      assert_dropped(c[2], "2nd client")
      assert_dropped(c[3], "3rd client")
      assert.equal(1, #srv:stdout_lines("^open "), srv:stdout())
      assert.is_nil((H.try_connect(port, { timeout = 1 })), "connect after l:close()")
      -- the accepted connection goes on
      assert.equal("more", H.roundtrip(c[1], "more"))
      assert.equal("ctl", H.roundtrip(control, "ctl"))
      assert.is_true(srv:alive(), srv:describe())
      assert.equal(0, srv:stop())
      assert_no_errors(srv)
    end)

    it("from on_data while another client connects at that moment", function()
      local srv, port = start("data")
      local a = H.connect(port)
      assert.equal("hi", H.roundtrip(a, "hi"))
      -- a's callback busy-waits; meanwhile a asks for the close and b
      -- connects, so both events come in one batch
      assert.is_true(H.send(a, "block 300\n"))
      H.sleep(0.1)
      assert.is_true(H.send(a, "close\n"))
      H.sleep(0.02)
      local b = H.connect(port)
      assert.is_true(H.send(b, "b"))
      assert.equal("blocked", H.read_line(a, H.T(3)))
      assert.equal("closed", H.read_line(a, H.T(3)))
      H.wait_for(function() return not srv:listens_on(port) end, H.T(3), "listener to close")
      assert_dropped(b, "client connecting during the close")
      assert.is_nil((H.try_connect(port, { timeout = 1 })), "connect after l:close()")
      assert.equal("still", H.roundtrip(a, "still"))
      assert.is_true(srv:alive(), srv:describe())
      assert.equal(0, srv:stop())
      assert_no_errors(srv)
    end)
  end)

  describe("yields that are not moonport waits", function()
    it("mp.sleep in a table.sort comparator fails under pcall and leaves nothing behind", function()
      local port = H.free_port()
      local srv = H.start("reg_yield.lua", { args = { port }, wait_port = port })
      local c = H.connect(port)
      assert.is_true(H.send(c, "sort\n"))
      local line = H.read_line(c, H.T(3))
      assert.truthy(line, "no answer to sort")
      assert.matches("^pcall false .", line)
      -- the connection keeps working, also past the would-be sleep times
      assert.equal("x1", H.roundtrip(c, "x1"))
      local d = H.connect(port)
      assert.is_true(H.send(d, "sortclose\n"))
      assert.matches("^pcall false .", (H.read_to_eof(d, H.T(3))))
      H.sleep(0.6)
      assert.equal("x2", H.roundtrip(c, "x2"))
      assert.is_true(H.send(c, "sort\n"))
      assert.matches("^pcall false .", H.read_line(c, H.T(3)))
      H.sleep(0.6)
      assert.equal("x3", H.roundtrip(c, "x3"))
      local e = H.connect(port)
      assert.equal("fresh", H.roundtrip(e, "fresh"))
      assert.is_true(srv:alive(), srv:describe())
      -- exactly the sortclose connection closed so far
      assert.same({ "close local" }, srv:stdout_lines("^close "))
      assert.equal(0, srv:stop())
      assert.is_nil(srv:stderr():find("moonport.wait", 1, true), srv:stderr())
    end)

    it("a bare coroutine.yield() is an error: the timer stops, the connection closes", function()
      local port = H.free_port()
      local srv = H.start("reg_yield.lua", { args = { port, "timers" }, wait_port = port })
      srv:wait_stdout("alive 8", H.T(5), true)
      -- the timer that yields on its 2nd run is stopped there
      H.sleep(0.2)
      assert.same({ "ytick 1", "ytick 2" }, srv:stdout_lines("^ytick"))
      assert.same({}, srv:stdout_lines("after yield"))
      -- both yielding timers are reported
      local function logged(what)
        local _, n = srv:stderr():gsub("error in " .. what .. ": [^\n]*yield", "")
        return n
      end
      assert.equal(2, logged("timer"), srv:stderr())

      local c = H.connect(port)
      assert.equal("a", H.roundtrip(c, "a"))
      assert.is_true(H.send(c, "yield\n"))
      assert_dropped(c, "connection whose on_data yielded")
      srv:wait_stdout("close error", H.T(3), true)
      H.wait_for(function() return logged("on_data") == 1 end, H.T(3),
        function() return "the on_data yield to be logged:\n" .. srv:stderr() end)
      -- the server goes on
      local d = H.connect(port)
      assert.equal("d", H.roundtrip(d, "d"))
      assert.is_true(srv:alive(), srv:describe())
      assert.equal(0, srv:stop())
    end)
  end)

  it("a failing timer whose userdata was collected while it slept stops only itself", function()
    local srv = H.start("reg_timer_gc.lua", { wait_stdout = "t1 failing" })
    srv:wait_stderr("t1 fails after the GC", H.T(3), true)
    local t_fail = H.now()
    -- T2 (every 40 ms) keeps ticking after the failure
    local before = #srv:stdout_lines("^t2 tick")
    H.wait_for(function() return #srv:stdout_lines("^t2 tick") >= before + 5 end,
      H.T(3), function() return "T2 ticks after the failure:\n" .. srv:describe() end)
    assert.is_true(H.now() - t_fail < H.T(2))
    assert.is_true(srv:alive(), srv:describe())
    assert.equal(0, srv:stop())
  end)

  describe("graceful shutdown with clients that reconnect from on_close / on_fail", function()
    for _, mode in ipairs { "hold", "churn" } do
      it("exits 0 soon after SIGTERM (-g 1, " .. mode .. ")", function()
        local port = H.free_port()
        local srv = H.start("reg_reconnect.lua", {
          args = { port, mode }, wait_port = port, grace = 1,
          wait_stdout = mode == "churn" and "dialed 100\n" or "dialed 1\n",
        })
        H.sleep(0.1)
        local t0 = H.now()
        local st, how = srv:stop(H.SIGTERM, H.T(6))
        local took = H.now() - t0
        assert.equal(0, st, tostring(how) .. "\n" .. srv:describe())
        assert.is_true(took < 1 + H.T(2), ("exited %.2fs after SIGTERM with -g 1"):format(took))
        assert.is_false(H.is_listening(port))
      end)
    end
  end)

  describe("hang-ups", function()
    -- returns srv and the ports { echo =, quiet =, paused =, resumed = }
    local function start(spec_port, threads)
      local p = {}
      for _, k in ipairs { "echo", "quiet", "paused", "resumed" } do p[k] = H.free_port() end
      local srv = H.start("reg_hangup.lua", {
        args = { p.echo, p.quiet, p.paused, p.resumed, 700, spec_port or "none" },
        wait_port = p.resumed, threads = threads,
      })
      return srv, p
    end

    -- reason and ms (since open) of the first on_close of tag, waiting up
    -- to `within` seconds for it.
    local function closed(srv, tag, within)
      local reason, ms = srv:wait_stdout("close " .. tag .. " (%a+) (%d+)\n", within)
      return reason, tonumber(ms)
    end

    it("data and FIN together: on_data, then on_close 'peer' at once", function()
      -- on_data writes nothing: no write event comes to wake the connection
      local srv, p = start()
      for i = 1, 3 do
        local c = H.connect(p.quiet)
        H.wait_for(function() return #srv:stdout_lines("^quiet open$") == i end, H.T(2), "on_open")
        local t0 = H.now()
        assert.is_true(H.send(c, "hello" .. i))
        assert.truthy(c:shutdown("send"))
        local data, how = H.read_to_eof(c, H.T(1))
        local took = H.now() - t0
        assert.equal("", data, "no EOF: " .. tostring(how) .. "\n" .. srv:describe())
        assert.is_true(took < H.T(0.5), ("EOF came %.2fs after the FIN"):format(took))
        srv:wait_stdout("qdata hello" .. i .. "\n", H.T(1), true)
        H.wait_for(function() return #matches(srv, "^close quiet") == i end, H.T(1),
          function() return "on_close #" .. i .. ":\n" .. srv:describe() end)
        local last = matches(srv, "^close quiet (%a+) (%d+)$")[i]
        assert.equal("peer", last[1])
        assert.is_true(tonumber(last[2]) < 1000 * H.T(0.5), "on_close " .. last[2] .. " ms after open")
      end
      assert.equal(0, srv:stop())
    end)

    it("data and FIN together: the echo arrives, then EOF at once", function()
      local srv, p = start()
      for i = 1, 3 do
        local c = H.connect(p.echo)
        H.wait_for(function() return #srv:stdout_lines("^echo open$") == i end, H.T(2), "on_open")
        local t0 = H.now()
        assert.is_true(H.send(c, "hello" .. i))
        assert.truthy(c:shutdown("send"))
        local data, how = H.read_to_eof(c, H.T(1))
        local took = H.now() - t0
        assert.equal("hello" .. i, data, "no echo then EOF: " .. tostring(how) .. "\n" .. srv:describe())
        assert.is_true(took < H.T(0.5), ("EOF came %.2fs after the FIN"):format(took))
        srv:wait_stdout("data hello" .. i, H.T(1), true)
      end
      H.wait_for(function() return #srv:stdout_lines("^close echo peer ") == 3 end,
        H.T(1), function() return "3 on_close 'peer':\n" .. srv:stdout() end)
      assert.equal(3, #srv:stdout_lines("^close "), srv:stdout())
      assert.equal(0, srv:stop())
    end)

    it("data and FIN together reach an mp.connect client: on_close 'peer' at once", function()
      local server = assert(require("socket").bind("127.0.0.1", 0))
      local _, spec_port = server:getsockname()
      server:settimeout(H.T(5))
      local srv = start(spec_port, 1)
      local peer = server:accept()
      server:close()
      assert.truthy(peer, "the fixture did not connect")
      srv:wait_stdout("client busy", H.T(2), true)
      assert.truthy(peer:send("from spec"))
      peer:close()
      srv:wait_stdout("cdata from spec", H.T(2), true)
      local reason, ms = srv:wait_stdout("cclose (%a+) (%d+)\n", H.T(1))
      assert.equal("peer", reason)
      assert.is_true(tonumber(ms) < 500, "on_close came " .. ms .. " ms after the data")
      assert.equal(0, srv:stop())
    end)

    it("a paused connection whose client resets gets on_close at once", function()
      local srv, p = start()
      local c = H.connect(p.paused)
      srv:wait_stdout("paused", H.T(2), true)
      assert.is_true(H.send(c, "unread"))
      c:setoption("linger", { on = true, timeout = 0 })
      c:close()
      local reason, ms = closed(srv, "paused", H.T(1))
      assert.truthy(reason == "peer" or reason == "error", reason)
      assert.is_true(ms < 1000, "on_close " .. ms .. " ms after open")
      assert.equal(0, srv:stop())
    end)

    it("a paused connection whose client closes (FIN) gets on_close 'peer' by resume() at the latest", function()
      local srv, p = start()
      local c = H.connect(p.resumed)
      srv:wait_stdout("paused", H.T(2), true)
      assert.is_true(H.send(c, "sent before FIN"))
      c:close()
      local reason, ms = closed(srv, "resumed", H.T(3))
      assert.equal("peer", reason)
      -- resumed after 700 ms; on_close may come at once or after that
      assert.is_true(ms < 700 + 1000 * H.T(0.3), "on_close " .. ms .. " ms after open")
      -- bytes sent before the FIN are not lost
      if srv:stdout():find("resumed\n", 1, true) then
        srv:wait_stdout("rdata sent before FIN", H.T(1), true)
      end
      assert.equal(0, srv:stop())
    end)
  end)

  describe("mp.listen checks", function()
    local function result(srv, name)
      local line = srv:stdout():match("\n" .. name .. " ([^\n]*)\n")
        or srv:stdout():match("^" .. name .. " ([^\n]*)\n")
      assert.truthy(line, "no " .. name .. " line:\n" .. srv:describe())
      return line
    end

    it("report bad arguments, and two port = 0 listens get two ports", function()
      local fixed = H.free_port()
      local srv = H.start("reg_api.lua", { args = { fixed }, wait_stdout = "ready\n" })
      -- a 299 / 300 character address: a clean error (ASan: no overflow)
      assert.matches("^false .", result(srv, "long299"))
      assert.matches("^false .", result(srv, "long300"))
      -- times must be a whole number
      assert.matches("^false .*times", result(srv, "every_frac"))
      -- listening twice on one address: an error naming it; the first stays
      assert.matches("^false .*127%.0%.0%.1:" .. fixed, result(srv, "twice"))
      local f = H.connect(fixed)
      assert.equal("fixed:x", H.roundtrip(f, "x", "fixed:x"))
      -- two port = 0 listens: two ports, each with its own handlers
      local ports = matches(srv, "^port0 (%d+) (%d+)$")
      assert.truthy(ports[1], srv:stdout())
      local pa, pb = tonumber(ports[1][1]), tonumber(ports[1][2])
      assert.is_true(pa > 0 and pb > 0 and pa ~= pb, "ports " .. pa .. " " .. pb)
      for _, p in ipairs(ports) do       -- every lane: the same two sockets
        assert.same(ports[1], p, srv:stdout())
      end
      H.wait_for(function() return srv:listens_on(pa) and srv:listens_on(pb) end, H.T(2),
        "both port-0 listeners")
      local a, b = H.connect(pa), H.connect(pb)
      assert.equal("a:1", H.roundtrip(a, "1", "a:1"))
      assert.equal("b:2", H.roundtrip(b, "2", "b:2"))
      assert.is_true(srv:alive(), srv:describe())
      assert.equal(0, srv:stop())
    end)

    for _, case in ipairs {
      { "abc", "port = 'abc'", "port" },
      { "twice", "the same port twice", "127%.0%.0%.1:%d+" },
      { "longhost", "a 300 character address", "." },
    } do
      it("at top level: " .. case[2] .. " ends startup with one clear line", function()
        local fixed = H.free_port()
        local st, out, err = H.run({ H.fixture("reg_api.lua"), fixed, case[1] }, { timeout = H.T(5) })
        assert.equal(1, st, "status " .. tostring(st) .. "\n" .. out .. err)
        local lines = H.lines(err)
        assert.equal(1, #lines, "stderr:\n" .. err)
        assert.matches("^moonport: ", lines[1])
        assert.matches(case[3], lines[1])
        -- an epoll detail ("File exists") is not a reason a user can act on
        assert.is_nil(lines[1]:find("File exists", 1, true), lines[1])
        assert.equal("", out)
        assert.is_false(H.is_listening(fixed))
      end)
    end
  end)

  describe("clients and Unix peers", function()
    it("conn:close() while connecting gives on_fail 'closed', never on_close", function()
      local port = H.free_port()
      local path = H.tmpdir() .. "/reg.sock"
      local srv = H.start("reg_client.lua", { args = { port, path }, wait_port = port })
      srv:wait_stdout("late data echo:hi", H.T(3), true)
      H.sleep(0.1)
      assert.same({ "early fail closed" }, srv:stdout_lines("^early fail"))
      assert.same({}, srv:stdout_lines("^early open"))
      assert.same({}, srv:stdout_lines("^early close %a+$"))
      assert.same({ "early closed false" }, srv:stdout_lines("^early closed"))
      assert.is_true(srv:alive(), srv:describe())
      assert.equal(0, srv:stop())
    end)

    it("conn:peer() of a Unix connection is 'unix' and the socket path", function()
      local port = H.free_port()
      local path = H.tmpdir() .. "/peer.sock"
      local srv = H.start("reg_client.lua", { args = { port, path }, wait_path = path })
      local c = H.connect_unix(path)
      assert.is_true(H.send(c, "peer\n"))
      assert.equal("unix " .. path, H.read_line(c, H.T(2)))
      assert.equal(0, srv:stop())
    end)
  end)

  it("max_queue: writes from a timer to a client that never reads fail with 'queue full'", function()
    local port = H.free_port()
    local srv = H.start("reg_max_queue.lua", { args = { port }, wait_port = port })
    local rss0 = assert(srv:rss_kb())
    local c = H.connect(port, { rcvbuf = 4096 })
    local err, pending = srv:wait_stdout("full (.-) (%d+)\n", H.T(3))
    assert.equal("queue full", err)
    H.sleep(0.6)                                 -- the timer goes on writing
    assert.same({}, srv:stdout_lines("^runaway"), srv:stdout())
    local max = 0
    for _, m in ipairs(matches(srv, "^max (%d+)$")) do max = math.max(max, tonumber(m[1])) end
    assert.is_true(max > 0, srv:stdout())
    assert.is_true(tonumber(pending) <= 65536 + 16384, "pending " .. pending)
    assert.is_true(max <= 65536 + 16384, "pending reached " .. max)
    local rss = assert(srv:rss_kb())
    assert.is_true(rss - rss0 < 16 * 1024, ("RSS grew from %d to %d kB"):format(rss0, rss))
    assert.is_true(srv:alive(), srv:describe())
    c:close()
    assert.equal(0, srv:stop())
  end)

  it("child processes started from a lane can be stopped with SIGTERM", function()
    local pidfile = H.tmpdir() .. "/child.pid"
    local srv = H.start("reg_child.lua", { args = { pidfile }, wait_stdout = "started\n" })
    local pids = {
      ["os.execute"] = tonumber(H.wait_for(function() return H.read_file(pidfile) end,
        H.T(3), "pid file")),
      ["io.popen"] = tonumber(srv:stdout():match("popen (%d+)")),
    }
    assert.truthy(pids["os.execute"] and pids["io.popen"], srv:describe())
    local function gone(pid)
      local st = H.read_file("/proc/" .. pid .. "/status")
      return not st or st:find("State:%s*Z") ~= nil
    end
    local ok, e = pcall(function()
      for how, pid in pairs(pids) do
        local status = H.read_file("/proc/" .. pid .. "/status")
        assert.truthy(status, how .. ": child already gone")
        local blk = status:match("SigBlk:%s*(%x+)")
        local ign = status:match("SigIgn:%s*(%x+)")
        -- signal n is bit n-1: 0x4000 is SIGTERM, 0x1000 SIGPIPE
        assert.equal(0, bit.band(tonumber(blk:sub(-8), 16), 0x4000),
          how .. ": child has SIGTERM blocked (SigBlk " .. blk .. ")")
        assert.equal(0, bit.band(tonumber(ign:sub(-8), 16), 0x1000),
          how .. ": child has SIGPIPE ignored (SigIgn " .. ign .. ")")
        ffi.C.kill(pid, H.SIGTERM)
        H.wait_for(function() return gone(pid) end, 1, how .. ": the child to end on SIGTERM")
      end
    end)
    for _, pid in pairs(pids) do
      if not gone(pid) then ffi.C.kill(pid, H.SIGKILL) end
    end
    assert(ok, e)
    assert.equal(0, srv:stop())
  end)

  it("port = 0 listeners opened and closed in every lane at once (-t 4)", function()
    -- reg_churn.lua: per round and lane two port-0 listeners, a probe
    -- connection to each, then everything closed
    local rounds = 30
    local srv = H.start("reg_churn.lua", { args = { rounds }, threads = 4 })
    H.wait_for(function()
      return #srv:stdout_lines("^done ") == 4 or not srv:alive()
        or srv:stderr():find("error", 1, true)
    end, H.T(10), function() return "4 lanes done:\n" .. srv:describe() end)
    assert.is_true(srv:alive(), srv:describe())
    assert_no_errors(srv)
    assert.same({}, srv:stdout_lines("^bad "), srv:stdout())
    local ok = 0
    for _, m in ipairs(matches(srv, "^done (%d+) (%d+) (%d+)$")) do ok = ok + tonumber(m[2]) end
    -- 2 probes per round and lane; a few may be dropped by design (above)
    assert.is_true(ok >= 4 * rounds, "only " .. ok .. " echoes:\n" .. srv:stdout())
    assert.equal(0, srv:stop())
    assert.equal("", srv:stderr())
  end)
end)
