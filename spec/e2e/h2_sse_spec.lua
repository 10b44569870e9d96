-- Spec: Server-Sent Events over HTTP/2 (res:sse and pub/sub-fed streams on
-- an h2 stream, src/http/h2.c + http/h2_stream.h), through the real binary
-- with clients we did not write: curl --http2 (TLS, ALPN) and
-- --http2-prior-knowledge (h2c) reading events, nghttp holding several
-- event streams and a plain request on one connection, and python3-h2
-- (spec/fixtures/h2_sse_client.py) where a case needs a shut window or a
-- RST_STREAM. The app is spec/fixtures/h2_sse_app.lua.
local H = require "spec.helper"
local P = require "spec.protocols"
local cjson = require "cjson"

local start, cleanup = H.fixture_servers("h2_sse_app.lua")
local H2C, TLS = P.list[2], P.list[3]

local function state(proto, base)
  local st, out, err = proto.curl({ "-sS", base .. "/state" })
  assert.equal(0, st, err)
  return cjson.decode(out)
end

local function publish(proto, base, ch, msg)
  local st, out, err = proto.curl({ "-sS", "-X", "POST", "--data-binary", msg, base .. "/publish/" .. ch })
  assert.equal(0, st, err)
  assert.equal("ok", out)
end

local function wait_state(proto, base, fn, what)
  local last
  H.wait_for(function()
    last = state(proto, base)
    return fn(last)
  end, H.T(10), function() return what .. ": " .. cjson.encode(last) end, 0.05)
  return last
end

local function reader(proto, base, path, extra)
  local argv = { "/usr/bin/curl", "-sS", "-N", "-v", "--max-time", tostring(H.T(30)) }
  for _, a in ipairs(proto.curl_args) do argv[#argv + 1] = a end
  for _, a in ipairs(extra or {}) do argv[#argv + 1] = a end
  argv[#argv + 1] = base .. path
  local q = H.spawn(argv)
  q.sanitizer_checked = true
  return q
end

local function client(port, case, arg, timeout)
  local st, out, err = H.exec({ "/usr/bin/python3", H.fixture("h2_sse_client.py"), port, case, arg },
    { timeout = timeout or H.T(40) })
  assert.equal(0, st, err)
  return cjson.decode(H.lines(out)[1])
end

describe("SSE over HTTP/2", function()
  after_each(cleanup)

  for _, proto in ipairs { H2C, TLS } do
    it(proto.name .. ": curl reads the handler's, on_open's and published events on an h2 stream; the stream ends and is freed", function()
      local base = proto.start(start)
      local q = reader(proto, base, "/events/a")
      H.wait_for(function() return q:stdout():find("data: opened a\n\n", 1, true) end, H.T(10),
        function() return q:stdout() .. q:stderr() end)
      local out = q:stdout()
      assert.truthy(out:find("event: greet\nid: 1\ndata: hello a over 2\n\n", 1, true), out)
      assert.truthy(q:stderr():find("< HTTP/2 200", 1, true), q:stderr())
      assert.truthy(q:stderr():find("< content-type: text/event-stream", 1, true), q:stderr())
      assert.truthy(q:stderr():find("< cache-control: no-cache", 1, true), q:stderr())
      assert.equal(1, state(proto, base).sse)
      publish(proto, base, "a", "first\nsecond")
      H.wait_for(function() return q:stdout():find("data: first\ndata: second\n\n", 1, true) end, H.T(10),
        function() return q:stdout() end)
      publish(proto, base, "a.ctl", "close") -- sse:close(): END_STREAM, curl is done
      assert.equal(0, (q:wait_exit(H.T(10))), q:stderr())
      wait_state(proto, base, function(s) return s.sse == 0 and s.closed == 1 end, "the stream freed")
    end)
  end

  it("nghttp: three event streams and a plain GET on one connection; each gets its own events, / is answered while they are open", function()
    local base = H2C.start(start)
    local q = H.spawn({ "/usr/bin/nghttp", "-v", base .. "/events/x", base .. "/events/y", base .. "/events/z",
      base .. "/" })
    q.sanitizer_checked = true
    wait_state(H2C, base, function(s) return s.sse == 3 end, "three streams open")
    H.wait_for(function() return q:stdout():find("home", 1, true) end, H.T(10), function() return q:stdout() end)
    for _, ch in ipairs { "x", "y", "z" } do publish(H2C, base, ch, "to-" .. ch) end
    H.wait_for(function()
      local o = q:stdout()
      return o:find("data: to-x\n", 1, true) and o:find("data: to-y\n", 1, true) and o:find("data: to-z\n", 1, true)
    end, H.T(10), function() return q:stdout() end)
    for _, ch in ipairs { "x", "y", "z" } do publish(H2C, base, ch .. ".ctl", "close") end
    assert.equal(0, (q:wait_exit(H.T(10))), q:stderr())
    local out = q:stdout()
    -- one connection: nghttp numbers its streams 13, 15, ... on it
    local ids = {}
    for id in out:gmatch("recv %(stream_id=(%d+)%) :status: 200") do ids[#ids + 1] = tonumber(id) end
    assert.equal(4, #ids, out)
    for _, ch in ipairs { "x", "y", "z" } do
      local _, n = out:gsub("data: to%-" .. ch .. "\n", "")
      assert.equal(1, n, "each stream had its own message once: " .. out)
      assert.truthy(out:find("data: hello " .. ch .. " over 2\n", 1, true), out)
    end
    wait_state(H2C, base, function(s) return s.sse == 0 and s.closed == 3 end, "the streams freed")
  end)

  it("a handler that goes on after res:sse() (sleeps between sends), an on_open and a subscriber that sleep hold only their stream: / on the same connection is answered meanwhile", function()
    local base = H2C.start(start)
    local q = H.spawn({ "/usr/bin/nghttp", "-v", base .. "/ticks/t", base .. "/" })
    q.sanitizer_checked = true
    -- the ticks handler is still looping when / is answered (it stops only
    -- when told below)
    H.wait_for(function()
      local o = q:stdout()
      return o:find("home", 1, true) and o:find("data: tick 2\n", 1, true) and o:find("data: late open t\n", 1, true)
    end, H.T(10), function() return q:stdout() end)
    assert.equal(1, state(H2C, base).sse)
    publish(H2C, base, "t.ctl", "close") -- its subscriber sleeps, then stops the loop
    assert.equal(0, (q:wait_exit(H.T(10))), q:stderr())
    local out = q:stdout()
    local ids = {}
    for id in out:gmatch("recv %(stream_id=(%d+)%) :status: 200") do ids[#ids + 1] = tonumber(id) end
    assert.equal(2, #ids, "one connection, two streams: " .. out)
    wait_state(H2C, base, function(s) return s.sse == 0 and s.closed == 1 end, "the stream freed")
    -- the same route over HTTP/1.1: the handler's loop holds its own connection, as before
    local h1 = reader(P.list[1], base, "/ticks/u") -- (h2c = true serves HTTP/1.1 too)
    H.wait_for(function() return h1:stdout():find("data: tick 2\n", 1, true) end, H.T(10),
      function() return h1:stdout() .. h1:stderr() end)
    publish(H2C, base, "u.ctl", "close")
    assert.equal(0, (h1:wait_exit(H.T(10))), h1:stderr())
    assert.truthy(h1:stdout():find("data: late open u\n", 1, true), h1:stdout())
  end)

  it("back pressure: a stream whose window stays shut is reset (CANCEL) at max_queue, its send fails, the connection's other streams and other clients go on, memory stays bounded", function()
    local base, srv, port = H2C.start(start, { "max_queue=262144" })
    local rss0 = srv:rss_kb()
    local r = client(port, "slow", 16384) -- 16 MiB asked for, 256 KiB allowed
    assert.equal(8, r.reset, cjson.encode(r)) -- CANCEL
    assert.equal(0, r.flood_bytes)
    assert.truthy(r.text:find("data: hello slow over 2\n\n", 1, true), r.text)
    assert.truthy(r.text:find("data: opened slow\n\n", 1, true), r.text)
    assert.equal("200", r.home)
    assert.equal(cjson.null, r.goaway)
    local s = wait_state(H2C, base, function(x) return x.flood ~= nil and x.sse == 0 end, "the flood's end")
    assert.equal("queue full", s.flood)
    assert.truthy(s.sent >= 1 and s.sent <= 16, "at most max_queue buffered: " .. s.sent .. " sends of 16 KiB")
    local grown = srv:rss_kb() - rss0
    assert.truthy(grown < 32 * 1024, "RSS grew by " .. grown .. " KiB")
  end)

  it("a stream whose bytes don't move for two idle timeouts is reset; an idle one gets a comment at each and stays open", function()
    local _, _, port = H2C.start(start, { "timeout=1" })
    local r = client(port, "idle", H.T(4)) -- (a slower build: a longer look, the same bound)
    assert.truthy(r.comments >= 2, cjson.encode(r))
    assert.equal(cjson.null, r.reset)
    assert.equal(cjson.null, r.goaway)
    assert.is_false(r.ended)
    r = client(port, "stall")
    assert.equal(8, r.reset, cjson.encode(r))
    assert.truthy(r.seconds < 10, cjson.encode(r))
  end)

  it("RST_STREAM from the client frees the stream (on_close runs, subscriptions go); 100 in a row, then the same connection is served", function()
    local n = H.scale > 1 and 40 or 100
    local base, srv, port = H2C.start(start)
    local rss0 = srv:rss_kb()
    local r = client(port, "rst", n)
    assert.equal(n, r.events)
    assert.equal("200", r.home)
    assert.equal(cjson.null, r.goaway)
    wait_state(H2C, base, function(s) return s.sse == 0 and s.closed == n end, "every stream freed")
    -- the reset streams' subscriptions are gone: a publish reaches nobody
    publish(H2C, base, "r0", "nobody")
    local grown = srv:rss_kb() - rss0
    assert.truthy(grown < 32 * 1024, "RSS grew by " .. grown .. " KiB")
  end)

  it("SIGTERM ends the event streams (END_STREAM, curl exits 0) and the server exits 0", function()
    local base, srv = H2C.start(start)
    local q = reader(H2C, base, "/events/t")
    H.wait_for(function() return q:stdout():find("data: opened t\n\n", 1, true) end, H.T(10),
      function() return q:stdout() .. q:stderr() end)
    assert.equal(0, (srv:stop(H.SIGTERM, H.T(10))))
    assert.equal(0, (q:wait_exit(H.T(10))), q:stderr())
  end)

  it("a reload (SIGHUP, -w 2) ends the old worker's event streams; a new one is served by the new workers", function()
    local base, srv = TLS.start(start, {}, { workers = 2 })
    local q = reader(TLS, base, "/events/h")
    H.wait_for(function() return q:stdout():find("data: opened h\n\n", 1, true) end, H.T(10),
      function() return q:stdout() .. q:stderr() end)
    srv:kill(H.SIGHUP)
    assert.equal(0, (q:wait_exit(H.T(20))), q:stderr())
    local q2 = reader(TLS, base, "/events/h2")
    H.wait_for(function() return q2:stdout():find("data: opened h2\n\n", 1, true) end, H.T(10),
      function() return q2:stdout() .. q2:stderr() end)
    q2:kill(H.SIGKILL)
    q2:wait_exit(5)
  end)

  it("compress = true: the h2 event stream is gzip'd, flushed at each event", function()
    local base = H2C.start(start, { "compress=true" })
    local q = reader(H2C, base, "/events/g", { "--compressed" })
    H.wait_for(function() return q:stdout():find("data: opened g\n\n", 1, true) end, H.T(10),
      function() return q:stdout() .. q:stderr() end)
    assert.truthy(q:stderr():find("< content-encoding: gzip", 1, true), q:stderr())
    publish(H2C, base, "g", "zipped")
    H.wait_for(function() return q:stdout():find("data: zipped\n\n", 1, true) end, H.T(10),
      function() return q:stdout() end)
    publish(H2C, base, "g.ctl", "close")
    assert.equal(0, (q:wait_exit(H.T(10))), q:stderr())
  end)
end)
