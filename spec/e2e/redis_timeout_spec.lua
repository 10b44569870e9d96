-- Spec: timeouts of mp.redis (issue 12). A private redis-server per test
-- (the one on PATH, or $MOONPORT_TEST_REDIS_SERVER), frozen with SIGSTOP:
-- a waiting r:cmd and a callback-style one answer nil, "timeout" in their
-- time (the client's, or the command's own { timeout = ms }) while the
-- lane goes on serving; after SIGCONT the same connection serves again and
-- no late reply reaches a later command. The connect path: a Redis that
-- accepts and never answers, and an address that never answers the SYN (a
-- listener on 127.0.0.1 with a full accept queue). The server runs
-- spec/fixtures/redis_client.lua (its header lists the line commands).
local H = require "spec.helper"
local ffi = require "ffi"     -- kill is declared by spec/helper.lua
local socket = require "socket"
local lfs = require "lfs"

local C = ffi.C
local SIGSTOP, SIGCONT = 19, 18

local function which(name)
  for dir in (os.getenv("PATH") or "/usr/bin:/bin"):gmatch("[^:]+") do
    local p = dir .. "/" .. name
    if lfs.attributes(p, "mode") == "file" then return p end
  end
end

local REDIS_SERVER = os.getenv("MOONPORT_TEST_REDIS_SERVER") or which("redis-server")
  or "/usr/sbin/redis-server"

local function redis_answers(port)
  local c = socket.tcp()
  c:settimeout(0.5)
  local ok = c:connect("127.0.0.1", port)
  if not ok then c:close() return false end
  c:send("*1\r\n$4\r\nPING\r\n")
  local line = c:receive("*l")
  c:close()
  return line == "+PONG"
end

-- A redis-server of this test's own (H.spawn: killed by H.cleanup, stopped
-- or not); returns it and its port.
local function start_redis()
  local port = H.free_port()
  local srv = H.spawn { REDIS_SERVER, "--port", tostring(port), "--bind", "127.0.0.1",
    "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", "/tmp",
    "--loglevel", "warning" }
  H.wait_for(function()
    if not srv:alive() then error("redis-server exited: " .. srv:describe(), 0) end
    return redis_answers(port)
  end, H.T(10), function() return "redis-server on port " .. port .. ": " .. srv:describe() end)
  return srv, port
end

local function freeze(rsrv) assert.equal(0, C.kill(rsrv:pid(), SIGSTOP)) end
local function thaw(rsrv) C.kill(rsrv:pid(), SIGCONT) end

local function enc(s)
  return (tostring(s):gsub("[^%w%.%-_:*]", function(c) return ("%%%02X"):format(c:byte()) end))
end

-- The fixture on one lane (-t 1: every connection shares the clients'
-- reactor) unless threads says otherwise.
local function start_fixture(url, opts, threads)
  local port = H.free_port()
  local srv = H.start("redis_client.lua", { args = { port, url, opts or "-" }, wait_port = port,
    threads = threads or 1 })
  return { srv = srv, port = port }
end

local function line_client(node)
  local c = H.connect(node.port)
  local cl = { c = c }
  function cl.send(line) assert(H.send(c, line .. "\n", H.T(10))) end
  function cl.line(timeout)
    local reply, err = H.read_line(c, timeout or H.T(10))
    if not reply then error(("no line (%s): %s"):format(tostring(err), node.srv:describe()), 2) end
    return reply
  end
  -- A new client and a command in one write, so that one on_data makes
  -- both and the command meets the connect that has just begun (not a
  -- connect timeout already over, on a slow start under a sanitizer).
  function cl.new_then(url, opts, line, timeout)
    cl.send(("newopts %s %s\n%s"):format(enc(url), opts, line))
    assert.equal("new", cl.line(timeout))
    return cl.line(timeout)
  end
  function cl.cmd(line, timeout)
    cl.send(line)
    return cl.line(timeout)
  end
  return cl
end

-- "t= <v> <err> <ms>" (or "tcb= ...") -> v, err, ms
local function timed(line)
  local tag, v, err, ms = line:match("^(t%a*=) (%S+) (%S+) (%d+)$")
  assert(tag, "not a timed reply: " .. line)
  return v, err, tonumber(ms)
end

-- A timeout of `ms` answered in its time: not before (the reactor's clock
-- may be a millisecond behind mp.now) and not much after.
local function in_time(got, ms, what)
  assert(got >= ms - 5, ("%s: answered after %d ms, before its %d ms timeout"):format(what, got, ms))
  assert(got <= ms + H.T(0.5) * 1000, ("%s: answered after %d ms (timeout %d ms)"):format(what, got, ms))
end

local TIMEOUT = '"timeout"'

describe("mp.redis timeouts", function()
  after_each(function() H.cleanup() end)

  it("a frozen Redis: a waiting r:cmd gives nil, \"timeout\" in the client's 300 ms, a { timeout = 100 } one in 100, a callback one in 200, while the lane serves other connections; { timeout = 0 } waits; after SIGCONT the same connection serves and no late reply reaches a later command", function()
    local rsrv, P = start_redis()
    local K = start_fixture("redis://127.0.0.1:" .. P, "timeout=300")
    local k1, k2, k3 = line_client(K), line_client(K), line_client(K)
    H.wait_for(function() return k1.cmd("connected") == "connected true" end, H.T(5), "connected")
    local key = enc("tmo.k." .. C.getpid())
    assert.equal('= "OK" <nil>', k1.cmd("cmd SET " .. key .. " v1"))
    local id = k1.cmd("cmd CLIENT ID")
    assert.truthy(id:match("^= %d+ <nil>$"), id)

    freeze(rsrv)
    local ok, err = pcall(function()
      -- the client's timeout
      k1.send("timed GET " .. key)
      -- meanwhile the lane answers another connection at once, again and again
      local t0 = H.now()
      local rounds = 0
      while H.now() - t0 < 0.25 do
        local s = H.now()
        assert.equal("lane 1", k2.cmd("lane"))
        assert(H.now() - s < H.T(0.2), ("a round trip on another connection took %.0f ms while a command waited"):format((H.now() - s) * 1000))
        rounds = rounds + 1
      end
      assert(rounds >= 3, "only " .. rounds .. " round trips in 250 ms")
      local v, e, ms = timed(k1.line(H.T(5)))
      assert.equal("<nil>", v)
      assert.equal(TIMEOUT, e)
      in_time(ms, 300, "the client's timeout")
      -- the command's own, shorter
      v, e, ms = timed(k1.cmd("tcmd 100 GET " .. key, H.T(5)))
      assert.equal("<nil> " .. TIMEOUT, v .. " " .. e)
      in_time(ms, 100, "{ timeout = 100 }")
      -- callback style, the command's own
      assert.equal("sent true <nil>", k1.cmd("tcb 200 GET " .. key))
      v, e, ms = timed(k1.line(H.T(5)))
      assert.equal("<nil> " .. TIMEOUT, v .. " " .. e)
      in_time(ms, 200, "a callback's { timeout = 200 }")
      -- no timeout at all: it waits for Redis
      assert.equal("sent true <nil>", k3.cmd("tcb 0 SET " .. key .. " v2"))
      assert.is_true(H.silent_for(k3.c, H.T(0.6)), "a command with { timeout = 0 } answered while Redis was frozen")
    end)
    thaw(rsrv)
    assert(ok, err)
    -- the SET queued behind three timed-out GETs is answered: the
    -- connection was kept, and its late replies went nowhere
    local v, e = timed(k3.line(H.T(5)))
    assert.equal('"OK" <nil>', v .. " " .. e)
    assert.equal('= "v2" <nil>', k1.cmd("cmd GET " .. key))
    assert.equal(id, k1.cmd("cmd CLIENT ID"), "the connection was replaced")
    assert.equal('= "PONG" <nil>', k1.cmd("cmd PING"))
    assert.is_true(H.silent_for(k1.c, H.T(0.3)), "a late reply reached a callback")
    assert.is_nil(K.srv:sanitizer_report())
    assert.equal(0, (K.srv:stop()))
  end)

  it("many commands time out at once, waiting and with callbacks, on connections of several lanes; each answers once; the server then serves and stops clean", function()
    local rsrv, P = start_redis()
    local K = start_fixture("redis://127.0.0.1:" .. P, "timeout=200", H.test_threads)
    local cs = {}
    for i = 1, 8 do cs[i] = line_client(K) end
    for _, c in ipairs(cs) do
      H.wait_for(function() return c.cmd("connected") == "connected true" end, H.T(5), "connected")
    end
    freeze(rsrv)
    local ok, err = pcall(function()
      for i, c in ipairs(cs) do
        for j = 1, 5 do
          c.send(((i + j) % 2 == 0 and "timed INCR " or "tcb 150 INCR ") .. "tmo.n")
        end
      end
      for _, c in ipairs(cs) do
        local answers = 0
        while answers < 5 do
          local line = c.line(H.T(5))
          if line ~= "sent true <nil>" then
            local v, e = timed(line)
            assert.equal("<nil> " .. TIMEOUT, v .. " " .. e)
            answers = answers + 1
          end
        end
      end
    end)
    thaw(rsrv)
    assert(ok, err)
    for _, c in ipairs(cs) do
      local r = c.cmd("cmd INCR tmo.n")
      assert.truthy(r:match("^= %d+ <nil>$"), r)
      assert.is_true(H.silent_for(c.c, H.T(0.2)), "a second answer to a timed-out command")
    end
    assert.equal("= 49 <nil>", cs[1].cmd("cmd INCR tmo.n"), "the 40 timed-out INCRs (and 8 more) were sent once each")
    assert.equal(0, (K.srv:stop()))
  end)

  it("a client closed from inside a timeout's answer (waiting, and in a callback with a command queued behind) frees nothing twice", function()
    local rsrv, P = start_redis()
    local K = start_fixture("redis://127.0.0.1:" .. P, "timeout=300")
    local k = line_client(K)
    H.wait_for(function() return k.cmd("connected") == "connected true" end, H.T(5), "connected")
    freeze(rsrv)
    local ok, err = pcall(function()
      assert.equal('tmoclose wait <nil> ' .. TIMEOUT, k.cmd("tmoclose wait"))
      assert.equal('tmoclose cb <nil> ' .. TIMEOUT, k.cmd("tmoclose cb"))
      assert.is_true(H.silent_for(k.c, H.T(0.3)), "a callback of a closed client ran")
    end)
    thaw(rsrv)
    assert(ok, err)
    H.wait_for(function() return k.cmd("connected") == "connected true" end, H.T(5), "connected")
    assert.equal('= "PONG" <nil>', k.cmd("cmd PING"))
    assert.is_nil(K.srv:sanitizer_report())
    local st, how = K.srv:stop(H.SIGTERM, H.T(10))
    assert.equal(0, st, tostring(how))
  end)

  it("connecting to a Redis that accepts and never answers: the first command fails in the command's timeout, or, when the handshake (AUTH) hangs, with \"connect timeout\" in connect_timeout", function()
    local rsrv, P = start_redis()
    local K = start_fixture("redis://127.0.0.1:" .. P, "timeout=300")
    local k = line_client(K)
    freeze(rsrv)
    local ok, err = pcall(function()
      local v, e, ms = timed(k.new_then("redis://127.0.0.1:" .. P, "timeout=300,connect_timeout=5000",
        "timed PING", H.T(5)))
      assert.equal("<nil> " .. TIMEOUT, v .. " " .. e)
      in_time(ms, 300, "the first command's timeout")
      -- a password: the link is not up before AUTH is answered
      v, e, ms = timed(k.new_then("redis://:pw@127.0.0.1:" .. P, "timeout=5000,connect_timeout=300",
        "timed PING", H.T(5)))
      assert.equal('<nil> "connect\\032timeout"', v .. " " .. e)
      assert(ms <= 300 + H.T(0.5) * 1000, "connect timeout after " .. ms .. " ms")
      K.srv:wait_stderr(("redis (mp.redis): timed out connecting to 127.0.0.1:%d: no answer"):format(P), H.T(5), true)
      assert.equal("lane 1", k.cmd("lane"))
    end)
    thaw(rsrv)
    assert(ok, err)
    assert.equal(0, (K.srv:stop()))
  end)

  it("connecting to an address that never answers the SYN (a full accept queue on 127.0.0.1): \"connect timeout\" in connect_timeout, or \"timeout\" in a shorter command timeout; the lane serves meanwhile", function()
    local l = socket.tcp()
    assert(l:bind("127.0.0.1", 0))
    assert(l:listen(0))
    local _, BH = l:getsockname()
    local filler = socket.tcp()
    filler:settimeout(H.T(2))
    assert(filler:connect("127.0.0.1", BH))   -- the queue's only place: later SYNs are dropped
    local probe = socket.tcp()
    probe:settimeout(0.2)
    assert.equal("timeout", select(2, probe:connect("127.0.0.1", BH)), "the address is not a black hole")
    probe:close()
    local ok, err = pcall(function()
      local K = start_fixture("redis://127.0.0.1:" .. BH)
      local k, k2 = line_client(K), line_client(K)
      k.send(("newopts %s timeout=5000,connect_timeout=300\ntimed PING"):format(enc("redis://127.0.0.1:" .. BH)))
      assert.equal("new", k.line())
      assert.equal("lane 1", k2.cmd("lane"))
      local v, e, ms = timed(k.line(H.T(5)))
      assert.equal('<nil> "connect\\032timeout"', v .. " " .. e)
      assert(ms <= 300 + H.T(0.5) * 1000, "connect timeout after " .. ms .. " ms")
      v, e, ms = timed(k.new_then("redis://127.0.0.1:" .. BH, "timeout=200,connect_timeout=5000",
        "timed PING", H.T(5)))
      assert.equal("<nil> " .. TIMEOUT, v .. " " .. e)
      in_time(ms, 200, "the command's timeout while connecting")
      assert.equal(0, (K.srv:stop()))
    end)
    filler:close()
    l:close()
    assert(ok, err)
  end)

  it("bad options raise, naming the option", function()
    local _, P = start_redis()
    local K = start_fixture("redis://127.0.0.1:" .. P)
    local k = line_client(K)
    assert.equal("badopt redis: cmd: unknown option 'timeot'"
      .. " | redis: cmd: timeout must be a number of milliseconds from 0 to 86400000"
      .. " | redis: cmd: timeout must be a number of milliseconds from 0 to 86400000"
      .. " | redis: cmd needs a command name"
      .. " | mp.redis: timeout must be a number of milliseconds from 0 to 86400000"
      .. " | mp.redis: connect_timeout must be a number of milliseconds from 1 to 86400000"
      .. " | mp.redis: unknown option 'bogus'"
      .. " | bad argument #2 to '?' (table expected, got number)",
      k.cmd("badopt"))
    assert.equal('= "PONG" <nil>', k.cmd("cmd PING"))
    assert.equal(0, (K.srv:stop()))
  end)
end)
