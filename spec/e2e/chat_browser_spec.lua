-- Spec: examples/chat in a real browser. `moonport -w 2
-- examples/chat/app.lua PORT` (started as a user would, from the
-- repository root with a relative path) serves the page; two Chromium
-- pages driven by playwright-core (spec/node/chat_browser.js), on
-- different workers, chat through it both ways, and again after every
-- worker was killed (the page reconnects by itself). The same browser checks EventSource reconnecting with
-- Last-Event-ID against spec/fixtures/ws_node_app.lua. Then the same chat
-- over HTTPS and WSS (`app.lua PORT CERT KEY`), with the spec's test CA
-- put in the browser's NSS database (certutil), so the certificate is
-- verified as any site's would be.
local H = require "spec.helper"
local JS = require "spec.js"
local ffi = require "ffi"
local lfs = require "lfs"
local cjson = require "cjson"

local APP = "examples/chat/app.lua"
local started = {}

local function kill_workers(srv, name)
  local pids = {}
  for _, pid in ipairs(H.children(srv:pid())) do
    local cl = H.cmdline(pid)
    if cl and cl:find(name, 1, true) then
      ffi.C.kill(pid, H.SIGKILL)
      pids[#pids + 1] = pid
    end
  end
  return pids
end

local function cleanup()
  for _, s in ipairs(started) do
    if s.srv:alive() then kill_workers(s.srv, s.name) end
  end
  started = {}
  H.cleanup()
end

-- moonport -w 2 examples/chat/app.lua PORT [CERT KEY], from the
-- repository root.
local function start_chat(cert)
  local port = H.free_port()
  local argv = { H.bin, "-w", "2", APP, tostring(port) }
  if cert then argv[#argv + 1] = cert.cert; argv[#argv + 1] = cert.key end
  local srv = H.spawn(argv)
  started[#started + 1] = { srv = srv, name = APP }
  H.wait_for(function()
    if not srv:alive() then error("chat app exited: " .. srv:describe(), 0) end
    return srv:listens_on(port)
  end, H.T(10), function() return "the chat app listening: " .. srv:describe() end)
  return srv, port
end

-- One HTTP GET on a new connection: status, headers (lower-case), body.
local function get(port, path)
  local c = H.connect(port)
  assert.is_true(H.send(c, ("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):format(path)))
  local text, err = H.read_to_eof(c, H.T(5))
  assert.truthy(text, "response to " .. path .. ": " .. tostring(err))
  local head, body = text:match("^(.-)\r\n\r\n(.*)$")
  local status = tonumber(head:match("^HTTP/1%.1 (%d+)"))
  local headers = {}
  for k, v in head:gmatch("\r\n([^:]+):%s*([^\r]*)") do headers[k:lower()] = v end
  return status, headers, body
end

-- The JSON lines of a browser script's output.
local function rows_of(text)
  local t = {}
  for _, l in ipairs(H.lines(text)) do
    local ok, v = pcall(cjson.decode, l)
    if ok and type(v) == "table" then t[#t + 1] = v end
  end
  return t
end

-- Runs chat_browser.js against the chat on `port`, killing the workers
-- when it says "drop me"; returns its rows once it ended, and a function
-- describing what happened. `env` adds to its environment.
local function run_browser(srv, port, sse_port, env)
  local go = H.tmpdir() .. "/go"
  local benv = {}
  for k, v in pairs(JS.env) do benv[k] = v end
  for k, v in pairs(env or {}) do benv[k] = v end
  local p = H.spawn({ JS.node, JS.dir .. "/chat_browser.js", tostring(port), go, sse_port and tostring(sse_port) },
    { env = benv })
  p.sanitizer_checked = true
  local function rows() return rows_of(p:stdout()) end
  local function describe()
    return "--- browser script stdout:\n" .. p:stdout():sub(-4000) ..
      "\n--- its stderr:\n" .. p:stderr():sub(-3000) .. "\n--- server: " .. srv:describe()
  end
  -- Chromium's steps take what this machine gives them: wait while the
  -- script makes progress (a new line within H.T(60): a Chromium start on
  -- a loaded machine took over 20 s before its first), 180 s at most
  local seen, last = -1, H.now()
  H.wait_for(function()
    if not p:alive() then error("the browser script ended early:\n" .. describe(), 0) end
    local out = p:stdout()
    if #out ~= seen then seen, last = #out, H.now() end
    if H.now() - last > H.T(60) then error("the browser script made no progress for 60 s:\n" .. describe(), 0) end
    return JS.find(rows(), "step", "drop me")
  end, H.T(180), describe)
  local killed = kill_workers(srv, APP)
  assert.equal(2, #killed, "two workers")
  assert(io.open(go, "w")):close()
  -- the rest (reconnects, the chat after them, the exit): as above
  seen, last = -1, H.now()
  local ok = pcall(H.wait_for, function()
    local out = p:stdout()
    if #out ~= seen then seen, last = #out, H.now() end
    if H.now() - last > H.T(60) then error("no progress for 60 s", 0) end
    return not p:alive()
  end, H.T(180), describe)
  local st = ok and p:wait_exit(5)
  if not st then p:kill(H.SIGKILL); p:wait_exit(5) end
  assert.equal(0, st, describe())
  return rows(), describe
end

-- The chat steps both runs check: two workers, messages both ways and
-- after the reconnection.
local function check_chat(r, describe)
  assert.truthy(JS.find(r, "done", true), describe())
  -- the two pages talk through different workers
  local placed = assert(JS.find(r, "step", "placed"), describe())
  assert.truthy(placed.a == 1 or placed.a == 2, "alice's worker: " .. tostring(placed.a))
  assert.truthy(placed.b == 1 or placed.b == 2, "bob's worker: " .. tostring(placed.b))
  assert.are_not.equal(placed.a, placed.b, "pages on different workers after " .. placed.rounds .. " tries")
  for _, step in ipairs { "a to b", "b to a", "after reconnect" } do
    local s = assert(JS.find(r, "step", step), step .. " missing:\n" .. describe())
    assert.is_true(s.ok, step .. ": " .. cjson.encode(s))
    assert.equal("", s.input_left, step .. ": the input was cleared")
  end
  for _, row in ipairs(r) do assert.is_nil(row.pageerror, "page error: " .. tostring(row.pageerror)) end
  -- Chromium offers permessage-deflate and the chat's websocket.compress
  -- agrees it: every socket's 101 says so (the messages then go deflated)
  local agreed = 0
  for _, row in ipairs(r) do
    if row.ws_extensions ~= nil then
      assert.truthy(tostring(row.ws_extensions):find("^permessage%-deflate"), cjson.encode(row))
      agreed = agreed + 1
    end
  end
  assert.truthy(agreed >= 2, "the handshakes seen: " .. agreed .. "\n" .. describe())
end

describe("examples/chat:", function()
  after_each(cleanup)

  it("serves its page, script and style with their types, and 404 for anything else", function()
    local srv, port = start_chat()
    local st, h, body = get(port, "/")
    assert.equal(200, st, srv:describe())
    assert.truthy(h["content-type"]:find("text/html", 1, true))
    assert.equal(H.read_file(APP:gsub("app%.lua$", "index.html")), body)
    st, h, body = get(port, "/chat.js")
    assert.equal(200, st)
    assert.truthy(h["content-type"]:find("javascript", 1, true))
    assert.truthy(body:find("new WebSocket", 1, true))
    st, h = get(port, "/chat.css")
    assert.equal(200, st)
    assert.truthy(h["content-type"]:find("text/css", 1, true))
    assert.equal(404, (get(port, "/../app.lua")))
    assert.equal(404, (get(port, "/app.lua")))
  end)

  it("closes a socket that sends something other than a chat line (1003), or that opened elsewhere than /ws (1008)", function()
    local why = JS.missing()
    assert(not why, why)
    local srv, port = start_chat()
    for _, bad in ipairs { "not json", "[1,2]", '{"name":"x"}', '{"name":"x","text":"   "}',
        ('{"name":"x","text":"%s"}'):format(("y"):rep(8001)) } do
      local r = JS.run("ws_cases.js", { port, "send_close", "/ws", bad }, 15, srv)[1]
      assert.equal(1003, r.code, bad:sub(1, 40))
    end
    local r = JS.run("ws_cases.js", { port, "send_close", "/elsewhere", "-" }, 15, srv)[1]
    assert.equal(1008, r.code)
    assert.equal("the chat is at /ws", r.reason)
  end)

  it("cuts a long name at a character boundary, so the line still goes out as text", function()
    local why = JS.missing()
    assert(not why, why)
    local srv, port = start_chat()
    -- 127 bytes; byte 120 starts a "ü", so the cut keeps 119
    local name = "a" .. ("é"):rep(40) .. "日本" .. ("ü"):rep(20)
    local line = require("cjson").encode { name = name, text = "  hi ✓  " }
    local r = JS.run("ws_cases.js", { port, "send_recv", "/ws", line, 2 }, 15, srv)[1]
    local welcome, got = r.messages[1], r.messages[2]
    assert.truthy(welcome.data:find('"system":true', 1, true), welcome.data)
    assert.is_false(got.binary, "a text frame")
    local msg = require("cjson").decode(got.data)
    assert.equal("hi ✓", msg.text)
    assert.equal(name:sub(1, 119), msg.name)
    assert.is_number(msg.at)
  end)

  it("two Chromium pages chat both ways through -w 2, and again after every worker was killed", function()
    local why = JS.missing()
    assert(not why, why)
    assert(H.exists("/usr/bin/chromium"), "no /usr/bin/chromium (scripts/setup installs it)")
    local srv, port = start_chat()
    -- the SSE page: ws_node_app.lua, one process
    local sse_port = H.free_port()
    H.start("ws_node_app.lua", { args = { sse_port }, wait_port = sse_port })

    local r, describe = run_browser(srv, port, sse_port)
    check_chat(r, describe)
    -- a name and text with markup shows as text
    local ba = JS.find(r, "step", "b to a")
    local seen = table.concat(ba.to_has, "\n")
    assert.truthy(seen:find("bob:hi alice, bob here <b>not bold</b>", 1, true), seen)
    -- the sender sees its own message too (it comes back through the channel)
    assert.truthy(table.concat(ba.from_has, "\n"):find("bob:hi alice", 1, true))

    -- EventSource: first connection without Last-Event-ID, the reconnection
    -- with the id of the last message received
    local title = assert(JS.find(r, "step", "sse"), describe()).title
    local first_id = title:match("^last=nil header=nil message=hello#(id%-%d+%-%d+) ")
    assert.truthy(first_id, title)
    assert.truthy(title:find(("last=%s header=%s message=hello#"):format(first_id, first_id), 1, true), title)
  end)

  it("over HTTPS and WSS (moonport ... app.lua PORT CERT KEY), with the test CA trusted in Chromium's NSS database: two pages chat, and again after the workers were killed", function()
    local why = JS.missing()
    assert(not why, why)
    assert(H.exists("/usr/bin/chromium"), "no /usr/bin/chromium (scripts/setup installs it)")
    local certutil = "/usr/bin/certutil"
    assert(H.exists(certutil), "no " .. certutil .. " (scripts/setup installs libnss3-tools)")
    local ca = H.test_ca { "localhost" }   -- lists IP:127.0.0.1, the address the pages load
    local srv, port = start_chat(ca.localhost)

    -- a home of the browser's own whose NSS database trusts the CA (and only
    -- that: the certificate is checked, names included, as for any site)
    local home = H.tmpdir()
    local db = "sql:" .. home .. "/.pki/nssdb"
    assert(lfs.mkdir(home .. "/.pki"))
    assert(lfs.mkdir(home .. "/.pki/nssdb"))
    local st, out, err = H.exec { certutil, "-N", "-d", db, "--empty-password" }
    assert.equal(0, st, out .. err)
    -- control: before the CA is in it, the page does not load
    local env = { CHAT_HTTPS = "1", CHAT_HOME = home, CHAT_PROBE = "1" }
    for k, v in pairs(JS.env) do env[k] = v end
    st, out, err = H.exec({ JS.node, JS.dir .. "/chat_browser.js", port, "-" }, { env = env, timeout = H.T(30) })
    assert.equal(0, st, out .. err)
    local probe = assert(JS.find(rows_of(out), "step", "probe"), out .. err)
    assert.is_false(probe.ok, "the page loaded without the CA trusted")
    assert.truthy(probe.error:find("ERR_CERT_AUTHORITY_INVALID", 1, true), probe.error)
    st, out, err = H.exec { certutil, "-A", "-d", db, "-n", "moonport test CA", "-t", "C,,", "-i", ca.ca }
    assert.equal(0, st, out .. err)

    local r, describe = run_browser(srv, port, nil, { CHAT_HTTPS = "1", CHAT_HOME = home })
    check_chat(r, describe)
    -- both pages loaded over TLS from the certificate the CA issued, and
    -- their sockets went to wss://
    local loaded = 0
    for _, row in ipairs(r) do
      if row.loaded then
        loaded = loaded + 1
        assert.equal(("https://127.0.0.1:%d/"):format(port), row.loaded)
        assert.is_true(row.secure)
        assert.truthy(row.protocol == "TLS 1.3", row.protocol)
        assert.equal("localhost", row.subject)
        assert.equal("moonport test CA", row.issuer)
      end
    end
    assert.is_true(loaded >= 2, describe())
    local sockets = 0
    for _, row in ipairs(r) do
      if row.websocket then
        sockets = sockets + 1
        assert.equal(("wss://127.0.0.1:%d/ws"):format(port), row.websocket)
      end
    end
    assert.is_true(sockets >= 4, "two pages, and each again after the kill: " .. describe())
  end)
end)
