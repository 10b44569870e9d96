-- mp.tcp end to end: a handler (spec/fixtures/client_app.lua) talking to a
-- line-protocol peer (spec/fixtures/tcp_peer.lua, another moonport) over
-- real sockets, through each read mode, the timeouts, a closed peer, the
-- keep-alive pool (visible in the peer's connection count), every read
-- limit, back pressure against a peer that never reads, and a handler
-- error that must not take the worker down.
local H = require "spec.helper"
local socket = require "socket"

local function ask(c, line, timeout)
  H.send(c, line .. "\n")
  return H.read_line(c, timeout or H.T(5))
end

describe("mp.tcp", function()
  local app, peer, port, pport, sock_path, c
  setup(function()
    local dir = H.tmpdir()
    sock_path = dir .. "/peer.sock"
    pport = H.free_port()
    peer = H.start("tcp_peer.lua", { args = { pport, sock_path }, wait_port = pport,
                                     wait_path = sock_path, threads = 1 })
    port = H.free_port()
    -- MOONPORT_TEST_THREADS lanes (1 by default): every command runs on
    -- one lane, and the pool keys keep the commands apart
    app = H.start("client_app.lua", { args = { port }, wait_port = port })
  end)
  teardown(function()
    -- SIGTERM: the lane frees its sockets, pool and resolver (ASan sees it)
    assert.equal(0, app:stop())
    assert.equal(0, peer:stop())
    H.cleanup()
  end)
  before_each(function() c = H.connect(port) end)
  after_each(function() c:close() end)

  it("reads lines (\\n and \\r\\n), n bytes and 0 bytes", function()
    assert.equal('ok line1|line2|xxxxxxx|""', ask(c, "lines " .. pport))
  end)

  it("reads to the peer's close with *a", function()
    assert.equal("ok 300000 x", ask(c, "all " .. pport .. " 300000"))
  end)

  it("receiveuntil splits on a pattern across pieces, exclusive and inclusive, and gives the partial rest at close", function()
    assert.equal("ok a|b|c--|nil|closed|d", ask(c, "until " .. pport))
  end)

  it("a silent peer: the read timeout gives nil, \"timeout\" in time and the socket stays usable", function()
    local r = ask(c, "readtimeout " .. pport)
    local ms = tonumber(r:match("^err timeout (%d+) usable$"))
    assert.truthy(ms, r)
    assert.is_true(ms >= 190 and ms < 1000 * H.T(1), r)
  end)

  it("a blackhole peer (accept queue full): the connect timeout gives nil, \"timeout\"", function()
    local srv = assert(socket.bind("127.0.0.1", 0, 0))
    local _, bport = srv:getsockname()
    local fill = {}
    for i = 1, 8 do -- fill the accept queue; later SYNs are dropped
      local f = socket.tcp()
      f:settimeout(0)
      f:connect("127.0.0.1", bport)
      fill[i] = f
    end
    socket.sleep(0.1)
    local r = ask(c, "connecttimeout " .. bport)
    for _, f in ipairs(fill) do f:close() end
    srv:close()
    local ms = tonumber(r:match("^err timeout (%d+)$"))
    assert.truthy(ms, r)
    assert.is_true(ms >= 290 and ms < 1000 * H.T(1.5), r)
  end)

  it("a read that timed out keeps its bytes for the next read, of another mode", function()
    assert.equal("ok nil timeout nil a", ask(c, "switch " .. pport))
  end)

  it("a peer that closes: the line before, then nil, \"closed\" for reads and sends", function()
    assert.equal('ok bye|nil|closed|""|nil|closed', ask(c, "closed " .. pport))
  end)

  it("a peer that resets: the line before, then nil, \"connection reset\" for reads and sends", function()
    local l = assert(require("socket").bind("127.0.0.1", 0))
    local _, lport = l:getsockname()
    l:settimeout(H.T(10))
    assert.is_true(H.send(c, "reset " .. lport .. "\n"))
    local p = assert(l:accept())
    l:close()
    p:settimeout(H.T(10))
    assert.equal("hello", p:receive())
    p:send("line\n")
    assert.equal("got", p:receive())
    assert(p:setoption("linger", { on = true, timeout = 0 })) -- the close sends RST
    p:close()
    assert.equal("ok line|nil|connection reset|nil|connection reset", H.read_line(c, H.T(10)))
  end)

  it("a refused connection is nil, \"connection refused\"", function()
    assert.equal("err connection refused", ask(c, "refused " .. H.free_port()))
  end)

  it("connects by name through the resolver (/etc/hosts: localhost) and to a Unix path", function()
    assert.matches("^ok hi %d+$", ask(c, "name " .. pport .. " localhost"))
    assert.matches("^ok hi %d+$", ask(c, "unix " .. sock_path))
    assert.matches("^err ", ask(c, "name " .. pport .. " no-such-host.invalid"))
  end)

  it("setkeepalive pools the connection: getreusedtimes counts, the peer saw one connection", function()
    local r = ask(c, "pool " .. pport .. " 3")
    local a, b, n = r:match("^ok hi (%d+) r0,hi (%d+) r1,hi (%d+) r2$")
    assert.truthy(a, r)
    assert.equal(a, b)
    assert.equal(a, n) -- the peer accepted no new connection for rounds 2 and 3
  end)

  it("a pooled connection the peer closed is not handed out; unread bytes refuse the pool", function()
    local r = ask(c, "poolclose " .. pport)
    local r2 = tonumber(r:match("^ok r2=(%d+) r3=0 hi %d+$"))
    assert.truthy(r2, r)
    assert.is_true(r2 >= 1, r) -- the second socket came from the pool
    assert.equal("err unread data in the buffer", ask(c, "poolunread " .. pport))
  end)

  it("a pooled connection leaves the pool after its idle time", function()
    assert.equal("ok r0", ask(c, "poolidle " .. pport, H.T(8)))
  end)

  it("every buffered read has a limit with a clear error", function()
    assert.equal("err line too long", ask(c, "linelimit " .. pport))
    assert.equal("err line too long", ask(c, "linelimit2 " .. pport))
    assert.equal("err max_buffer exceeded", ask(c, "alllimit " .. pport))
    assert.equal("err max_buffer exceeded", ask(c, "untillimit " .. pport))
    assert.equal("err max_buffer exceeded", ask(c, "nlimit " .. pport))
  end)

  it("back pressure: a send to a peer that never reads waits, bounded by the send timeout", function()
    local srv = assert(socket.bind("127.0.0.1", 0))
    local _, sport = srv:getsockname()
    local r = ask(c, "backpressure " .. sport)
    srv:close()
    local ms = tonumber(r:match("^err timeout (%d+)$"))
    assert.truthy(ms, r)
    assert.is_true(ms >= 290 and ms < 1000 * H.T(1.5), r)
  end)

  it("a Lua error in the handler closes its connection, never the worker", function()
    H.send(c, "boom " .. pport .. "\n")
    local line, err = H.read_line(c)
    assert.is_nil(line)
    assert.equal("closed", err)
    app:wait_stderr("boom in the handler")
    local c2 = H.connect(port)
    assert.equal("echo still-here", ask(c2, "echo still-here"))
    assert.equal('ok line1|line2|xxxxxxx|""', ask(c2, "lines " .. pport))
    assert.is_true(app:alive())
  end)
end)

describe("mp.tcp send", function()
  after_each(H.cleanup)

  it("a send bigger than the write limit waits until the slow peer took it, then returns the count", function()
    local pport = H.free_port()
    local peer = H.start("tcp_peer.lua", { args = { pport }, wait_port = pport, threads = 1 })
    local port = H.free_port()
    local app = H.start("client_app.lua", { args = { port }, wait_port = port, threads = 1 })
    local c = H.connect(port)
    local r, err = ask(c, "bigsend " .. pport .. " 8", H.T(20))
    assert.truthy(r, tostring(err) .. "\n" .. app:stderr() .. peer:stderr())
    local n, got, ms = r:match("^ok (%d+) got (%d+) (%d+)$")
    assert.truthy(n, r)
    assert.equal(8 * 1024 * 1024, tonumber(n))
    assert.equal(8 * 1024 * 1024, tonumber(got))
    -- the peer reads 64 KiB per 20 ms: most of 8 MiB waited in the queue
    assert.is_true(tonumber(ms) >= 500, r)
    assert.equal(0, app:stop())
    assert.equal(0, peer:stop())
  end)
end)

describe("mp.tcp, mp.resolve and mp.wait at shutdown", function()
  after_each(H.cleanup)

  it("a read, a lookup and an mp.wait in progress end with the server, which exits cleanly", function()
    local stub = H.spawn({ "/usr/bin/python3", H.fixture("dns_stub.py") })
    local dport = stub:wait_stdout("ready (%d+)", H.T(5))
    local pport = H.free_port()
    local peer = H.start("tcp_peer.lua", { args = { pport }, wait_port = pport, threads = 1 })
    local port = H.free_port()
    local app = H.start("client_app.lua", {
      args = { port }, wait_port = port, threads = 1, grace = 1,
      env = { MOONPORT_DNS_SERVERS = "127.0.0.1:" .. dport },
    })
    local cs = {}
    for i, cmd in ipairs({ "hang_read " .. pport, "hang_dns", "hang_wait", "pool " .. pport .. " 1" }) do
      cs[i] = H.connect(port)
      H.send(cs[i], cmd .. "\n")
    end
    assert.matches("^ok hi", H.read_line(cs[4])) -- one connection in the pool
    stub:wait_stdout("query never.test", H.T(5))
    H.sleep(0.2)
    local t0 = H.now()
    assert.equal(0, app:stop(H.SIGTERM, H.T(10)))
    assert.is_true(H.now() - t0 < H.T(5), "shutdown waited for the 60 s timeouts")
    assert.equal(0, peer:stop())
  end)
end)
