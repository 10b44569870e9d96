-- Spec: examples/chat in a real browser. `moonport -w 2
-- examples/chat/app.lua PORT` (started as a user would, from the
-- repository root with a relative path) serves the page; two Chromium
-- pages driven by playwright-core (spec/node/chat_browser.js), on
-- different workers, chat through it both ways, and again after every
-- worker was killed (the page reconnects by itself). The same browser checks EventSource reconnecting with
-- Last-Event-ID against spec/fixtures/ws_node_app.lua.
local H = require "spec.helper"
local JS = require "spec.js"
local ffi = require "ffi"

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

-- moonport -w 2 examples/chat/app.lua PORT, from the repository root.
local function start_chat()
  local port = H.free_port()
  local srv = H.spawn({ H.bin, "-w", "2", APP, tostring(port) })
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

    local go = H.tmpdir() .. "/go"
    local p = H.spawn({ JS.node, JS.dir .. "/chat_browser.js", tostring(port), go, tostring(sse_port) },
    { env = JS.env })
    p.sanitizer_checked = true
    local function rows()
      local t = {}
      for _, l in ipairs(H.lines(p:stdout())) do
        local ok, v = pcall(require("cjson").decode, l)
        if ok and type(v) == "table" then t[#t + 1] = v end
      end
      return t
    end
    local function describe()
      return "--- browser script stdout:\n" .. p:stdout():sub(-4000) ..
        "\n--- its stderr:\n" .. p:stderr():sub(-3000) .. "\n--- server: " .. srv:describe()
    end

    H.wait_for(function()
      if not p:alive() then error("the browser script ended early:\n" .. describe(), 0) end
      return JS.find(rows(), "step", "drop me")
    end, H.T(20), describe)
    local killed = kill_workers(srv, APP)
    assert.equal(2, #killed, "two workers")
    assert(io.open(go, "w")):close()

    local st = p:wait_exit(H.T(25))
    if not st then p:kill(H.SIGKILL); p:wait_exit(5) end
    local r = rows()
    assert.equal(0, st, describe())
    assert.truthy(JS.find(r, "done", true), describe())
    -- the two pages talk through different workers
    local placed = assert(JS.find(r, "step", "placed"), describe())
    assert.truthy(placed.a == 1 or placed.a == 2, "alice's worker: " .. tostring(placed.a))
    assert.truthy(placed.b == 1 or placed.b == 2, "bob's worker: " .. tostring(placed.b))
    assert.are_not.equal(placed.a, placed.b, "pages on different workers after " .. placed.rounds .. " tries")
    for _, step in ipairs { "a to b", "b to a", "after reconnect" } do
      local s = assert(JS.find(r, "step", step), step .. " missing:\n" .. describe())
      assert.is_true(s.ok, step .. ": " .. require("cjson").encode(s))
      assert.equal("", s.input_left, step .. ": the input was cleared")
    end
    -- a name and text with markup shows as text
    local ba = JS.find(r, "step", "b to a")
    local seen = table.concat(ba.to_has, "\n")
    assert.truthy(seen:find("bob:hi alice, bob here <b>not bold</b>", 1, true), seen)
    -- the sender sees its own message too (it comes back through the channel)
    assert.truthy(table.concat(ba.from_has, "\n"):find("bob:hi alice", 1, true))
    for _, row in ipairs(r) do assert.is_nil(row.pageerror, "page error: " .. tostring(row.pageerror)) end

    -- EventSource: first connection without Last-Event-ID, the reconnection
    -- with the id of the last message received
    local title = assert(JS.find(r, "step", "sse"), describe()).title
    local first_id = title:match("^last=nil header=nil message=hello#(id%-%d+%-%d+) ")
    assert.truthy(first_id, title)
    assert.truthy(title:find(("last=%s header=%s message=hello#"):format(first_id, first_id), 1, true), title)
  end)
end)
