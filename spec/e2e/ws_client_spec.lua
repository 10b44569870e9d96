-- Spec: mp.websocket, the WebSocket client, against moonport's own
-- WebSocket server and against the npm `ws` server (spec/node/ws_server.js),
-- driven through spec/fixtures/ws_client_app.lua: GET /run?case=..&url=..
-- runs one client case in a handler and answers the events it saw.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local function esc(s)
  return (s:gsub("[^%w%-._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function get(port, target)
  local c = H.connect(port)
  H.send(c, ("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):format(target))
  local data = H.read_to_eof(c, H.T(15))
  c:close()
  assert.truthy(data, "no response to " .. target)
  return tonumber(data:match("^HTTP/1%.1 (%d%d%d)")), data:match("\r\n\r\n(.*)$")
end

describe("mp.websocket", function()
  local app, node, port, wsport, nport
  setup(function()
    local why = JS.missing()
    assert(not why, why)
    node = H.spawn({ JS.node, JS.dir .. "/ws_server.js" })
    nport = cjson.decode(node:wait_stdout("{[^\n]*}", H.T(10))).port
    port = H.free_port()
    app = H.start("ws_client_app.lua", { args = { port }, wait_port = port, threads = 1 })
    local st, body = get(port, "/wsport")
    assert.equal(200, st)
    wsport = tonumber(body)
  end)
  teardown(function()
    if app then assert.equal(0, app:stop()) end
    H.cleanup()
  end)

  -- Runs a case; returns its events (a list of strings).
  local function run(case, url)
    local st, body = get(port, "/run?case=" .. case .. "&url=" .. esc(url))
    assert.equal(200, st, body)
    local r = cjson.decode(body)
    return r.events, r.state
  end
  local function mine(path) return "ws://127.0.0.1:" .. wsport .. path end
  local function theirs(path) return "ws://127.0.0.1:" .. nport .. path end

  -- The node server's {"closed": ...} lines for `path` so far.
  local function node_closes(path)
    local out = {}
    for _, line in ipairs(H.lines(node:stdout())) do
      local ok, v = pcall(cjson.decode, line)
      if ok and type(v) == "table" and v.closed == path then out[#out + 1] = v end
    end
    return out
  end
  local function server_closes(path)
    local _, body = get(port, "/server_closes")
    local out = {}
    for _, v in ipairs(cjson.decode(body)) do
      if v.path == path then out[#out + 1] = v end
    end
    return out
  end

  local ECHO = { "open 101", "text hello", "binary 000102ff", "text 70000 same" }

  for _, peer in ipairs { "moonport", "ws" } do
    local url = function(p) return peer == "moonport" and mine(p) or theirs(p) end

    it(peer .. ": echoes text, binary and a 70000-byte message; closes with 4002 and a reason both sides see", function()
      local ev = run("echo", url("/echo"))
      for i, want in ipairs(ECHO) do assert.equal(want, ev[i], cjson.encode(ev)) end
      assert.matches("^close 4002", ev[5]) -- the server's echo of our code
      assert.equal(5, #ev)
      H.wait_for(function()
        local c = peer == "moonport" and server_closes("/echo") or node_closes("/echo")
        return #c > 0 and c[#c]
      end, H.T(5))
      local c = peer == "moonport" and server_closes("/echo") or node_closes("/echo")
      assert.equal(4002, c[#c].code)
      assert.equal("done", c[#c].reason)
    end)

    it(peer .. ": opts.fragment sends long messages as fragments of 1000 bytes, which the server joins", function()
      local ev = run("fragmented", url("/echo"))
      assert.same({ "open 101", "text 70000 same", "binary 000102ff", "binary 70001 same", "close 1000 " }, ev)
    end)

    it(peer .. ": without handlers mp.websocket waits for the handshake; ws:receive waits for a message, times out, sees the close", function()
      assert.same({ "text one", "binary 74776f", "nil timeout", "nil closed 4003", "nil closed" },
        run("waiting", url("/echo")))
    end)

    it(peer .. ": the server closes with 4001 \"bye\": on_close gets them", function()
      local ev = run("server_close", url("/close"))
      assert.same({ "open 101", "close 4001 bye" }, ev)
    end)

    it(peer .. ": ws:ping gets a pong with its payload", function()
      assert.same({ "open 101", "pong abc", "close 1000 " }, run("ping", url("/echo")))
    end)

    it(peer .. ": a subprotocol the server picks from the offered ones", function()
      local ev = run("proto", url("/proto"))
      assert.equal("open 101", ev[1])
      assert.equal("protocol chat.v2", ev[2])
    end)

    it(peer .. ": a message over max_msg closes with 1009, and the server is told 1009", function()
      local ev = run("big", url("/big?n=2000"))
      assert.same({ "open 101", "close 1009 message too big" }, ev)
      H.wait_for(function()
        local c = peer == "moonport" and server_closes("/big") or node_closes("/big")
        return #c > 0
      end, H.T(5))
      local c = peer == "moonport" and server_closes("/big") or node_closes("/big")
      assert.equal(1009, c[#c].code)
    end)

    it(peer .. ": a message of exactly max_msg arrives", function()
      local ev = run("big", url("/big?n=1000"))
      assert.equal("text 1000", ev[2])
    end)
  end

  it("ws: a message in three text fragments with a ping between them, and two binary fragments, arrive whole", function()
    local ev = run("frag", theirs("/frag"))
    assert.equal("text hello world", ev[2])
    assert.equal("binary 256", ev[3])
  end)

  it("ws: a server's ping is answered with a pong carrying its payload", function()
    assert.same({ "open 101", "text got pong xyz", "close 1000 " }, run("pingme", theirs("/pingme")))
  end)

  it("moonport: pinged when idle (the server's timeout is 1 s), the client's pongs keep it open", function()
    local ev = run("idle", mine("/echo"))
    assert.same({ "open 101", "text still here", "close 1000 " }, ev)
  end)

  it("a refused handshake is an on_error with the status: moonport's on_upgrade 404 and ws's 404", function()
    local ev = run("plain", mine("/nope"))
    assert.equal(1, #ev)
    assert.matches("^error handshake: status 404", ev[1])
    ev = run("plain", theirs("/404"))
    assert.equal(1, #ev)
    assert.matches("^error handshake: status 404", ev[1])
    ev = run("waiting", mine("/nope"))
    assert.same({ "nil handshake: status 404 (not 101 Switching Protocols)" }, ev)
  end)

  it("opts.headers go in the handshake: on_upgrade sees them", function()
    assert.same({ "open 101", "close 1000 " }, run("headers", mine("/token")))
    assert.matches("^error handshake: status 401", run("plain", mine("/token"))[1])
  end)

  it("a wrong Sec-WebSocket-Accept, a subprotocol not offered: on_error", function()
    assert.same({ "error handshake: wrong Sec-WebSocket-Accept" }, run("plain", theirs("/badaccept")))
    local ev = run("proto", theirs("/wrongproto"))
    assert.same({ "error handshake: the server chose subprotocol other, which was not offered" }, ev)
  end)

  it("a 101 whose head is over 16 KiB: on_error", function()
    assert.same({ "error handshake: response head too large" }, run("plain", theirs("/hugehead")))
  end)

  it("waiting style: 200 messages taken late (the client pauses past 64 queued) all arrive, in order", function()
    assert.same({ "200 in order" }, run("burst", theirs("/burst?n=200")))
  end)

  it("a server that masks its frames gets 1002", function()
    assert.same({ "open 101", "close 1002 protocol error" }, run("plain", theirs("/masked")))
  end)

  it("no server, a server that never answers: on_error (connection refused, timeout)", function()
    local ev = run("plain", "ws://127.0.0.1:" .. H.free_port() .. "/")
    assert.same({ "error connection refused" }, ev)
    local _, sport = get(port, "/silent")
    local t0 = H.now()
    ev = run("timeout", "ws://127.0.0.1:" .. sport .. "/")
    assert.same({ "error handshake: timeout" }, ev)
    assert.is_true(H.now() - t0 < H.T(3))
  end)

  it("ws:close() while connecting drops the attempt: no on_error, no on_close", function()
    local _, sport = get(port, "/silent")
    local ev, state = run("abort", "ws://127.0.0.1:" .. sport .. "/")
    assert.same({ "close true" }, ev)
    assert.equal("closed", state)
  end)

  it("bad urls are nil, err at once; wss:// connects (tls_client_spec has the rest)", function()
    assert.same({ "error connection refused" }, run("plain", "wss://127.0.0.1:" .. H.free_port() .. "/"))
    assert.same({ "nil mp.websocket: url must be ws:// or wss:// (got http://)" },
                run("plain", "http://127.0.0.1:1/"))
    -- the authority goes through mp.fetch's URL parser: a blank, CR or LF
    -- in it never reaches the Host line
    for _, bad in ipairs { "ws://127.0.0.1\r\nX-Evil: 1:" .. wsport .. "/", "ws://127.0.0.1 x:" .. wsport .. "/",
        "ws://127.0.0.1:" .. wsport .. "\r\nX: y/" } do
      local ev = run("plain", bad)
      assert.equal(1, #ev, bad)
      assert.truthy(ev[1]:find("^nil mp.websocket: bad URL %("), bad .. ": " .. ev[1])
    end
  end)

  it("a Lua error in on_message drops that connection (1006) and the lane keeps serving", function()
    local ev = run("lua_error", mine("/echo"))
    assert.same({ "open 101", "close 1006 " }, ev)
    local st, body = get(port, "/hello")
    assert.equal(200, st)
    assert.equal("hello", body)
    assert.matches("on_message failed on purpose", app:stderr() .. app:stdout())
  end)
end)
