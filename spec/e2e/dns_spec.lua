-- mp.resolve end to end: the lane's c-ares resolver pointed at a stub DNS
-- server the spec starts (spec/fixtures/dns_stub.py, via
-- MOONPORT_DNS_SERVERS); a slow answer must not delay another connection
-- on the same lane (-t 1).
local H = require "spec.helper"

local function ask(c, line, timeout)
  H.send(c, line .. "\n")
  return H.read_line(c, timeout or H.T(5))
end

describe("mp.resolve", function()
  local app, stub, port
  setup(function()
    stub = H.spawn({ "/usr/bin/python3", H.fixture("dns_stub.py") })
    local dport = stub:wait_stdout("ready (%d+)", H.T(5))
    port = H.free_port()
    app = H.start("client_app.lua", {
      args = { port }, wait_port = port, threads = 1,
      env = { MOONPORT_DNS_SERVERS = "127.0.0.1:" .. dport },
    })
  end)
  teardown(function()
    assert.equal(0, app:stop())
    H.cleanup()
  end)

  it("resolves a name the server knows, and numeric addresses without a query", function()
    local c = H.connect(port)
    assert.equal("ok 127.0.0.1", ask(c, "resolve fast.test"))
    assert.equal("ok 10.1.2.3", ask(c, "resolve 10.1.2.3"))
    assert.equal("ok ::1", ask(c, "resolve ::1"))
  end)

  it("reads /etc/hosts first (localhost)", function()
    local c = H.connect(port)
    assert.matches("127.0.0.1", ask(c, "resolve localhost 0 4"))
  end)

  it("an unknown name is nil, \"no such host\"", function()
    local c = H.connect(port)
    assert.equal("err no such host", ask(c, "resolve nope.test"))
  end)

  it("a server that never answers gives nil, \"timeout\" after the timeout", function()
    local c = H.connect(port)
    local t0 = H.now()
    assert.equal("err timeout", ask(c, "resolve never.test 300"))
    local took = H.now() - t0
    assert.is_true(took >= 0.29 and took < H.T(1.5), tostring(took))
  end)

  it("a slow answer waits only its coroutine: another connection on the lane is served meanwhile", function()
    local a, b = H.connect(port), H.connect(port)
    local t0 = H.now()
    H.send(a, "resolve slow.test 5000\n")
    H.sleep(0.05)
    assert.equal("echo meanwhile", ask(b, "echo meanwhile"))
    assert.is_true(H.now() - t0 < 0.7, "the other connection waited for the lookup")
    assert.equal("ok 127.0.0.1", ask(b, "resolve fast.test"))
    assert.is_true(H.now() - t0 < 0.8, "a lookup waited for the slow one")
    assert.equal("ok 127.0.0.2", H.read_line(a, H.T(5)))
    assert.is_true(H.now() - t0 >= 0.95, "the slow answer came early?")
  end)

  it("mp.tcp's connect timeout covers the lookup", function()
    local c = H.connect(port)
    local r = ask(c, "connecttimeout 9 never.test")
    local ms = tonumber(r:match("^err timeout (%d+)$"))
    assert.truthy(ms, r)
    assert.is_true(ms >= 290 and ms < 1000 * H.T(1.5), r)
  end)

  it("mp.connect looks a host name up on the lane's resolver; the connect timeout covers it", function()
    local c = H.connect(port)
    assert.matches("^ok open %d+$", ask(c, "connect_name fast.test " .. port))
    assert.matches("^err cannot resolve address %d+$", ask(c, "connect_name nope.test " .. port))
    local r = ask(c, "connect_name never.test " .. port .. " 0.3")
    local ms = tonumber(r:match("^err timeout (%d+)$"))
    assert.truthy(ms, r)
    assert.is_true(ms >= 290 and ms < 1000 * H.T(1.5), r)
  end)

  it("mp.connect's slow lookup waits only its coroutine", function()
    local a, b = H.connect(port), H.connect(port)
    local t0 = H.now()
    H.send(a, "connect_name slow.test " .. port .. "\n")
    H.sleep(0.05)
    assert.equal("echo meanwhile", ask(b, "echo meanwhile"))
    assert.is_true(H.now() - t0 < 0.7, "the other connection waited for mp.connect's lookup")
    -- 127.0.0.2: the app listens on every address, so the connect succeeds
    local r = H.read_line(a, H.T(5))
    assert.matches("^ok open %d+$", r)
    assert.is_true(tonumber(r:match("(%d+)$")) >= 950, r)
  end)

  it("mp.redis looks its URL's host name up on the lane's resolver", function()
    local rport = H.free_port()
    local redis = H.spawn({ "/usr/bin/redis-server", "--port", tostring(rport), "--bind", "127.0.0.1",
      "--save", "", "--appendonly", "no" })
    H.wait_for(function()
      local s = H.try_connect(rport)
      if s then s:close() return true end
    end, H.T(10), "redis-server")
    local c = H.connect(port)
    assert.equal("ok PONG", ask(c, "redis_name fast.test " .. rport))
    redis:kill(H.SIGKILL)
  end)

  it("bad arguments raise (the handler fails, the worker stays)", function()
    local c = H.connect(port)
    H.send(c, "resolve " .. string.rep("a", 300) .. "\n")
    assert.is_nil((H.read_line(c)))
    app:wait_stderr("host name of 1 to 253")
    assert.equal("echo ok", ask(H.connect(port), "echo ok"))
  end)
end)
