-- Spec: mp.http's WebSocket side, proven with a client we did not write:
-- the npm `ws` package, driven by spec/node/ws_cases.js against
-- spec/fixtures/ws_node_app.lua (paths listed there). The node script prints
-- what it saw as JSON lines; every assertion is made here.
local H = require "spec.helper"
local JS = require "spec.js"

local FIXTURE = "ws_node_app.lua"
-- start(extra, { workers = N }) -> srv, port, with extra { "nows" } for no
-- websocket table; cleanup() (H.fixture_servers)
local start, cleanup = H.fixture_servers(FIXTURE)

-- Runs a case of ws_cases.js against `port`; returns its rows.
local function case(srv, port, name, ...)
  return JS.run("ws_cases.js", { port, name, ... }, 25, srv)
end

describe("WebSocket, with the npm ws client:", function()
  setup(function()
    local why = JS.missing()
    assert(not why, why)
  end)
  after_each(cleanup)

  it("echoes text and binary messages byte for byte: empty, 1, 125/126/127, 65535/65536 bytes, multibyte UTF-8, 1 MiB", function()
    local srv, port = start()
    local rows = case(srv, port, "echo")
    assert.equal(18, #rows, "one row per payload")
    for _, r in ipairs(rows) do
      assert.equal(r.sent_len, r.got_len, r.name .. ": length")
      assert.is_true(r.same, r.name .. ": bytes differ")
      assert.equal(r.sent_binary, r.got_binary, r.name .. ": frame type")
    end
    assert.truthy(JS.find(rows, "name", "binary 1 MiB"))
  end)

  it("on_message's is_text tells text frames from binary; ws:send without is_text sends UTF-8 as text and the rest as binary", function()
    local srv, port = start()
    local rows = case(srv, port, "kinds")
    local want = {   -- name -> { is_text in Lua, frame type of the auto echo }
      ["ascii as binary"] = { false, false },
      ["ascii as text"] = { true, false },
      ["utf8 as binary"] = { false, false },
      ["invalid utf8 as binary"] = { false, true },
      ["empty as text"] = { true, false },
    }
    for name, w in pairs(want) do
      local r = assert(JS.find(rows, "name", name), name)
      assert.equal(w[1], r.lua_is_text, name .. ": is_text in on_message")
      assert.equal(w[2], r.auto_binary, name .. ": ws:send(data) frame is binary")
      assert.is_true(r.auto_same, name .. ": ws:send(data) bytes")
    end
    -- the empty string is valid UTF-8: text either way
    local e = assert(JS.find(rows, "name", "empty as binary"))
    assert.equal(false, e.lua_is_text)
    assert.equal(0, e.lua_len)
  end)

  it("answers a client's ping with a pong carrying the same payload, and goes on echoing", function()
    local srv, port = start()
    local r = case(srv, port, "ping")[1]
    assert.same({ "are you there", "" }, r.pongs)
    assert.equal("after ping", r.after)
  end)

  it("puts a fragmented message back together (with a ping between the fragments)", function()
    local srv, port = start()
    local r = case(srv, port, "fragments")[1]
    assert.equal("fragmented ✓", r.data)
    assert.is_false(r.binary)
  end)

  it("ws:close(code, reason): the client sees that code and reason", function()
    local srv, port = start()
    local r = case(srv, port, "server_close", 4001, "bye now ✓")[1]
    assert.equal(4001, r.code)
    assert.equal("bye now ✓", r.reason)
    assert.equal(0, r.messages)
    -- without a code: a normal closure (1000), or a close frame without a
    -- status (the client reports 1005), never an abrupt drop (1006)
    r = case(srv, port, "server_close")[1]
    assert.truthy(r.code == 1000 or r.code == 1005, "code " .. tostring(r.code))
  end)

  it("a client's close code and reason reach on_close, and the server answers the close at once", function()
    local srv, port = start()
    local r = case(srv, port, "client_close", 4002, "done here")[1]
    assert.truthy(r.on_close ~= require("cjson").null and r.on_close, "on_close ran")
    assert.equal(4002, r.on_close.code)
    assert.equal("done here", r.on_close.reason)
    assert.are_not.equal(1006, r.client_saw.code, "the server answered with a close frame")
    assert.is_true(r.handshake_ms < 2000, "close handshake took " .. r.handshake_ms .. " ms")
  end)

  it("a connection dropped without a close frame reaches on_close with 1006", function()
    local srv, port = start()
    local r = case(srv, port, "client_drop")[1]
    assert.truthy(r.on_close ~= require("cjson").null and r.on_close, "on_close ran")
    assert.equal(1006, r.on_close.code)
  end)

  it("max_msg: exactly max_msg bytes are echoed; one byte more (one frame or fragments) closes with 1009", function()
    local srv, port = start()
    local rows = case(srv, port, "too_big")
    assert.equal(1048576, JS.find(rows, "name", "at max").got_len)
    -- the client is still sending when the server decides: the close
    -- frame must still reach it (not a reset: the ws client says 1006)
    local one = JS.find(rows, "name", "one frame over")
    assert.equal(1009, one.code, "client error: " .. tostring(one.client_error))
    assert.equal(0, one.messages)
    local frag = JS.find(rows, "name", "fragments over")
    assert.equal(1009, frag.code)
    assert.equal(0, frag.messages)
    assert.is_true(srv:alive())
  end)

  it("a text message that is not UTF-8 closes with 1007", function()
    local srv, port = start()
    local r = case(srv, port, "bad_utf8")[1]
    assert.equal(1007, r.code)
    assert.equal(0, r.messages)
  end)

  it("on_open gets the upgrade request: method, path, query and headers", function()
    local srv, port = start()
    local r = case(srv, port, "info")[1]
    assert.is_false(r.binary, "a JSON string goes out as text")
    local info = r.info
    assert.equal("GET", info.method)
    assert.equal("/info", info.path)
    assert.equal("x=1&y=two%20words", info.query)
    assert.equal("abc", info.headers["x-test"])
    assert.equal("def", info.headers["x-other"])
    assert.equal("websocket", info.headers.upgrade:lower())
    assert.equal("13", info.headers["sec-websocket-version"])
    assert.equal("127.0.0.1", info.peer[1])
    assert.is_number(info.peer[2])
    assert.is_true(info.open)
    assert.equal("table", info.env)
  end)

  it("without a websocket table, an upgrade request is an ordinary request: on_request answers it", function()
    local srv, port = start { "nows" }
    local rows = case(srv, port, "refused")
    local r = rows[1]
    assert.is_false(r.opened)
    assert.equal(404, r.status, r.message)
    assert.equal("no route", r.body)
    assert.same({ status = 200, body = "plain" }, rows[2].after)
    assert.is_true(srv:alive())
  end)

  it("ws:subscribe(ch) with -w 2: every client, on both workers, gets every message in order, from an HTTP request and from a timer", function()
    local srv, port = start(nil, { workers = 2 })
    local rows = case(srv, port, "subscribe", "/sub", 40, "news", 50)
    assert.same({ "1", "2" }, JS.keys(rows[1].workers), "clients on both workers")
    local r = rows[2]
    assert.equal("published 50", r.pub.body)
    local want = {}
    for i = 1, 50 do want[#want + 1] = "h" .. i end
    for i = 1, 50 do want[#want + 1] = "t" .. i end
    assert.same({ [table.concat(want, ",")] = 40 }, r.sequences)
  end)

  it("ws:subscribe(ch, fn) with -w 2: fn runs for every message, in order, on both workers", function()
    local srv, port = start(nil, { workers = 2 })
    local rows = case(srv, port, "subscribe", "/subfn", 20, "fnchan", 30)
    assert.same({ "1", "2" }, JS.keys(rows[1].workers), "clients on both workers")
    local want = {}
    for i = 1, 30 do want[#want + 1] = "fn:h" .. i end
    for i = 1, 30 do want[#want + 1] = "fn:t" .. i end
    assert.same({ [table.concat(want, ",")] = 20 }, rows[2].sequences)
  end)

  it("ws:subscribe(pattern, nil, { match = \"glob\" }) gets the matching channels only", function()
    local srv, port = start()
    local r = case(srv, port, "glob")[1]
    assert.same({ "a1", "b1" }, r.got)
  end)

  it("a graceful shutdown (SIGTERM, -w 2) closes every socket with 1001", function()
    local srv, port = start(nil, { workers = 2 })
    local p = H.spawn({ JS.node, JS.dir .. "/ws_cases.js", tostring(port), "hold", "/echo", "20" },
      { env = JS.env })
    p.sanitizer_checked = true
    H.wait_for(function() return p:stdout():find('"opened":20', 1, true) or not p:alive() end,
      H.T(10), "20 sockets open")
    assert.equal(0, (srv:stop()), srv:describe())
    assert.equal(0, p:wait_exit(H.T(10)), p:stdout() .. p:stderr())
    local rows = {}
    for _, l in ipairs(H.lines(p:stdout())) do rows[#rows + 1] = require("cjson").decode(l) end
    local codes = assert(JS.find(rows, "done", true) and rows[#rows - 1].codes, p:stdout())
    local n, other = 0, {}
    for k, v in pairs(codes) do
      if k:match("^1001 ") then n = n + v else other[#other + 1] = k end
    end
    assert.equal(20, n, "closed otherwise: " .. table.concat(other, ", "))
  end)

  it("ws:subscribe without fn: a table arrives as its JSON (text), bytes that are not UTF-8 as binary, UTF-8 as text", function()
    local srv, port = start()
    local got = case(srv, port, "sub_kinds")[1].got
    local function unhex(h) return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end)) end
    assert.equal(3, #got)
    assert.is_false(got[1].binary)
    assert.same({ n = 1, s = "ü", list = { true, "x" } }, require("cjson").decode(unhex(got[1].hex)))
    assert.same({ hex = "fffe31", binary = true }, got[2])
    assert.same({ hex = "c3bc31", binary = false }, got[3])
  end)

  it("ws:subscribe without fn: a subscriber that stops reading is disconnected past max_queue, having had 1..k with no gap; one that reads gets all", function()
    local srv, port = start()
    local r = case(srv, port, "sub_slow", 128, 262144)[1]
    assert.equal(128, r.fast, "the reading subscriber got every message")
    assert.is_true(r.fast_in_order)
    assert.is_true(r.fast_open)
    assert.is_true(r.slow < 128, "the stalled subscriber can't have had all (" .. r.slow .. ")")
    assert.is_true(r.slow_gapless, "no gap in what the stalled one got")
    assert.is_true(r.slow_sizes)
    assert.are_not.equal(1000, r.slow_close)
  end)

  it("200 clients at once, each with 50 messages back to back: every echo, in order", function()
    local srv, port = start()
    local r = case(srv, port, "many", 200, 50)[1]
    assert.same({}, r.bad)
    assert.equal(200, r.ok)
  end)

  it("a client that reads slowly: ws:send says \"queue full\", on_ready resumes, nothing is lost", function()
    local srv, port = start()
    local r = case(srv, port, "flood", 80, 524288)[1]
    assert.equal(81, r.received)
    assert.is_true(r.sizes, "80 binary messages of 512 KiB")
    local sent, full = r.last:match("^done (%d+) (%d+)$")
    assert.equal("80", sent)
    assert.is_true(tonumber(full) > 0, "ws:send answered queue full at least once: " .. r.last)
  end)

  it("websocket.on_upgrade refuses before the 101 (403 for a bad Origin, 401 without a token: the ws client gets the status, headers and body), or accepts with a subprotocol the client offered and extra headers, also after mp.sleep", function()
    local srv, port = start { "hook" }
    local function up(path, protos, origin)
      return case(srv, port, "upgrade", path, protos or "-", origin or "-")[1]
    end
    local r = up("/guarded?token=s3cret", "chat.v1", "http://evil.example")
    assert.equal(403, r.refused, require("cjson").encode(r))
    assert.equal("origin", r.headers["x-why"])
    assert.equal("forbidden origin\n", r.body)
    r = up("/guarded?token=nope", "chat.v1", "http://good.example")
    assert.equal(401, r.refused, require("cjson").encode(r))
    assert.equal("token", r.headers["x-why"])
    r = up("/guarded?token=s3cret&pick=chat.v2", "chat.v1,chat.v2", "http://good.example")
    assert.is_true(r.opened, require("cjson").encode(r))
    assert.equal("chat.v2", r.protocol)
    assert.equal("yes", r.headers["x-upgrade"])
    assert.equal("sid=42", r.headers["set-cookie"] and r.headers["set-cookie"][1])
    assert.equal("guarded chat.v1,chat.v2", r.first)
    -- waiting inside on_upgrade; no subprotocol chosen
    r = up("/guarded?token=s3cret&wait=50", "-", "http://good.example")
    assert.is_true(r.opened, require("cjson").encode(r))
    assert.equal("", r.protocol)
    assert.is_nil(r.headers["sec-websocket-protocol"])
    -- a protocol the client didn't offer, or an error: 500, logged
    r = up("/badproto", "chat.v1")
    assert.equal(500, r.refused, require("cjson").encode(r))
    r = up("/raise")
    assert.equal(500, r.refused, require("cjson").encode(r))
    srv:wait_stderr("the client did not offer the protocol 'never-offered'", H.T(5), true)
    srv:wait_stderr("error in websocket on_upgrade:", H.T(5), true)
    srv:wait_stderr("boom in on_upgrade", H.T(5), true)
    -- paths without a decision are accepted as before
    local rows = case(srv, port, "echo")
    assert.equal(18, #rows)
    assert.is_true(srv:alive())
  end)
end)
