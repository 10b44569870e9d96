-- Spec: mp.listen { on_connect = function(sock) ... end }, the cosocket
-- style for servers, through the real binary over raw sockets
-- (spec/fixtures/on_connect_app.lua serves a line protocol).
local H = require "spec.helper"

local start, cleanup = H.fixture_servers("on_connect_app.lua")

local function live(port)
  local c = H.connect(port)
  H.send(c, "live\n")
  local l = H.read_line(c, H.T(5))
  c:close()
  return tonumber(l:match("^live (%d+)$"))
end

describe("mp.listen { on_connect = }", function()
  after_each(cleanup)
  local srv, port
  local env = {}
  -- what a connection's coroutine or socket leaves behind shows at exit
  if H.bin:find("asan", 1, true) then env.ASAN_OPTIONS = "detect_leaks=1:abort_on_error=0" end
  before_each(function() srv, port = start({}, { env = env }) end)

  it("reads lines (LF and CRLF), n bytes and up to a pattern, however the bytes arrive", function()
    local c = H.connect(port)
    H.send(c, "one\r\ntwo\nbytes\nabcdeuntil\nxx\nyy--END--thr")
    assert.equal("<one>", H.read_line(c, H.T(5)))
    assert.equal("<two>", H.read_line(c, H.T(5)))
    assert.equal("[abcde]", H.read_line(c, H.T(5)))
    assert.equal("{xx", H.read_line(c, H.T(5)))
    assert.equal("yy}", H.read_line(c, H.T(5)))
    H.send(c, "ee\n\nbyt")
    assert.equal("<three>", H.read_line(c, H.T(5)))
    assert.equal("<>", H.read_line(c, H.T(5)))
    H.send(c, "es\nab")
    H.sleep(0.05)
    H.send(c, "cde")
    assert.equal("[abcde]", H.read_line(c, H.T(5)))
    local many = {}
    for i = 1, 500 do many[i] = "l" .. i end
    H.send(c, table.concat(many, "\n") .. "\n")
    for i = 1, 500 do assert.equal("<l" .. i .. ">", H.read_line(c, H.T(5))) end
    H.send(c, "peer\n")
    local pl = H.read_line(c, H.T(5)); assert.truthy(pl, srv:stderr())
    local ip, p, uid = pl:match("^(%S+) (%d+) (%S+)$")
    assert.equal("127.0.0.1", ip)
    assert.truthy(tonumber(p) > 0, p)
    assert.truthy(uid:match("^%d+%-%d+$"), uid)
    c:close()
    assert.equal(0, srv:stop())
  end)

  it("closes the connection when on_connect returns, after its bytes are sent", function()
    local c = H.connect(port)
    H.send(c, "a\nbye\nnever\n")
    assert.equal("<a>\nbye\n", (H.read_to_eof(c, H.T(5))))
  end)

  it("a line past max_line gives receive nil, \"line too long\" and closes; the server goes on", function()
    local c = H.connect(port)
    H.send(c, ("x"):rep(64) .. "\n")
    assert.equal("<" .. ("x"):rep(64) .. ">", H.read_line(c, H.T(5)))
    H.send(c, ("y"):rep(65))
    assert.is_nil((H.read_line(c, H.T(5))))
    srv:wait_stdout("\nend line too long\n", H.T(5), true)
    local d = H.connect(port)
    H.send(d, "ok\n" .. ("z"):rep(100) .. "\nnever\n")
    assert.equal("<ok>", H.read_line(d, H.T(5)))
    assert.is_nil((H.read_line(d, H.T(5))))
    -- the coroutine ends just after the close, maybe on another lane (-t N)
    H.wait_for(function() return live(port) == 1 end, H.T(5), "coroutines ended")
  end)

  it("serves 200 concurrent clients doing 50 round trips each, all answers right", function()
    assert.is_true(H.raise_nofile(600) >= 400, "cannot raise RLIMIT_NOFILE")
    local N, R = 200, 50
    local cs = {}
    for i = 1, N do cs[i] = H.connect(port) end
    for r = 1, R do
      for i = 1, N do H.send(cs[i], "c" .. i .. "r" .. r .. "\n") end
      for i = 1, N do
        assert.equal("<c" .. i .. "r" .. r .. ">", H.read_line(cs[i], H.T(10)))
      end
    end
    assert.equal(N + 1, live(port))
    for i = 1, N do cs[i]:close() end
    H.wait_for(function() return live(port) == 1 end, H.T(5), "coroutines ended")
    assert.equal(0, srv:stop())
  end)

  it("a client gone mid-receive ends its coroutine with nil, \"closed\"", function()
    local c = H.connect(port)
    H.send(c, "half a li")
    H.sleep(0.05)
    H.wait_for(function() return live(port) == 2 end, H.T(5), "its coroutine started")
    c:close()
    srv:wait_stdout("\nend closed\n", H.T(5), true)
    H.wait_for(function() return live(port) == 1 end, H.T(5), "coroutine ended")
    -- gone in the middle of n bytes too
    local d = H.connect(port)
    H.send(d, "bytes\nab")
    H.sleep(0.05)
    d:close()
    H.wait_for(function() return live(port) == 1 end, H.T(5), "coroutine ended")
    assert.equal(0, srv:stop())
  end)

  it("an error in on_connect is logged and closes only that connection", function()
    local a, b = H.connect(port), H.connect(port)
    H.send(a, "x\n")
    assert.equal("<x>", H.read_line(a, H.T(5)))
    H.send(b, "boom\n")
    assert.is_nil((H.read_line(b, H.T(5))))
    H.wait_for(function() return srv:stderr():find("boom in on_connect", 1, true) end, H.T(5),
      "the error logged")
    assert.truthy(srv:stderr():find("error in on_connect", 1, true), srv:stderr())
    H.send(a, "still\n")
    assert.equal("<still>", H.read_line(a, H.T(5)))
    assert.is_true(srv:alive())
    a:close()
    assert.equal(0, srv:stop())
  end)

  it("exits 0 promptly on SIGTERM with coroutines waiting in receive", function()
    local cs = {}
    for i = 1, 20 do
      cs[i] = H.connect(port)
      H.send(cs[i], "w" .. i .. "\n")
      assert.equal("<w" .. i .. ">", H.read_line(cs[i], H.T(5)))
    end
    H.send(cs[1], "part of a li") -- buffered, no newline
    local t0 = H.now()
    local st, how = srv:stop(H.SIGTERM, H.T(6))
    local took = H.now() - t0
    assert.equal(0, st, tostring(how))
    assert.is_true(took < H.T(2), ("exited after %.2fs"):format(took))
    assert.truthy(srv:stdout():find("\nend shutdown\n", 1, true), srv:stdout())
    for i = 1, 20 do assert.equal("", (H.read_to_eof(cs[i], H.T(3)))) end
  end)

  it("send waits while the client doesn't read (back pressure), then finishes", function()
    local c = H.connect(port, { rcvbuf = 16384 })
    H.send(c, "flood\n")
    H.sleep(0.5)
    assert.is_nil(srv:stdout():find("flood done", 1, true), "send did not wait")
    local got = H.read_exact(c, 256 * 65536 + 1, H.T(20))
    assert.equal(256 * 65536 + 1, #got)
    srv:wait_stdout("\nflood done\n", H.T(5), true)
    assert.equal(2, live(port))
    c:close()
  end)

  it("a coroutine that never ends is cut at the grace deadline (-g 1), exit 0", function()
    srv:stop()
    srv, port = start({}, { env = env, options = { "-g", 1 } })
    local c, d = H.connect(port), H.connect(port)
    H.send(c, "forever\n")
    assert.equal("sleeping", H.read_line(c, H.T(5)))
    H.send(d, "idle\n")
    assert.equal("<idle>", H.read_line(d, H.T(5)))
    local t0 = H.now()
    local st, how = srv:stop(H.SIGTERM, H.T(8))
    assert.equal(0, st, tostring(how))
    assert.is_true(H.now() - t0 < 1 + H.T(3), tostring(H.now() - t0))
    assert.equal("", (H.read_to_eof(d, H.T(3))))
  end)

  it("the listener's idle timeout ends a waiting receive with nil, \"timeout\" and closes", function()
    srv:stop()
    local iport = H.free_port()
    srv, port = start({ iport }, { env = env })
    H.wait_for(function() return srv:listens_on(iport) end, H.T(5), "idle listener")
    local c = H.connect(iport)
    local t0 = H.now()
    H.send(c, "a\n")
    assert.equal("<a>", H.read_line(c, H.T(5)))
    assert.is_nil((H.read_line(c, H.T(5)))) -- closed by the server
    local took = H.now() - t0
    assert.is_true(took >= 0.25 and took < H.T(3), tostring(took))
    srv:wait_stdout("\nidle end timeout\n", H.T(5), true)
    assert.equal(0, srv:stop())
  end)

  it("refuses on_connect with on_data (or a bad max_line) at the script's line", function()
    local script = H.tmpdir() .. "/bad_oc.lua"
    local f = assert(io.open(script, "wb"))
    f:write('local mp = require "moonport"\n',
      'mp.listen { port = 1, on_connect = function() end, on_data = function() end }\n')
    f:close()
    local st, _, err = H.run { script }
    assert.equal(1, st)
    assert.truthy(err:find("bad_oc.lua:2: mp.listen: on_connect and on_data can't be used together",
      1, true), err)
    f = assert(io.open(script, "wb"))
    f:write('local mp = require "moonport"\n\n',
      'mp.listen { port = 1, on_connect = function() end, max_line = 0 }\n')
    f:close()
    st, _, err = H.run { script }
    assert.equal(1, st)
    assert.truthy(err:find("bad_oc.lua:3: mp.listen: max_line must be an integer", 1, true), err)
  end)
end)
