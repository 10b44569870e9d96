-- Spec: server-sent events (res:sse) read by a client we did not write:
-- node's http module under spec/node/sse_cases.js, which parses the
-- event stream by the HTML standard's rules, against
-- spec/fixtures/ws_node_app.lua. (spec/e2e/chat_browser_spec.lua also checks
-- Chromium's EventSource reconnecting with Last-Event-ID.)
local H = require "spec.helper"
local JS = require "spec.js"

local FIXTURE = "ws_node_app.lua"
-- start(extra, { workers = N }) -> srv, port; cleanup() (H.fixture_servers)
local start, cleanup = H.fixture_servers(FIXTURE)

local function case(srv, port, name, ...)
  return JS.run("sse_cases.js", { port, name, ... }, 20, srv)
end

local null = require("cjson").null

describe("SSE, with node's http client:", function()
  setup(function()
    local why = JS.missing()
    assert(not why, why)
  end)
  after_each(cleanup)

  it("sse:send(data, event, id): the events arrive with their event and id fields, multi-line data whole; sse:close() ends the stream", function()
    local srv, port = start()
    local r = case(srv, port, "events")[1]
    assert.equal(200, r.status)
    assert.truthy(r.type and r.type:find("^text/event%-stream"), "content-type " .. tostring(r.type))
    assert.same({
      { event = "greet", data = "one", id = "1" },
      { event = "message", data = "two\nlines", id = "2" },
      { event = "bye", data = "three", id = null },
    }, r.events)
  end)

  it("sse:subscribe(ch) with -w 2: every stream, on both workers, gets every message in order", function()
    local srv, port = start(nil, { workers = 2 })
    local rows = case(srv, port, "subscribe", "/sse/sub", 20, "ssenews", 40)
    assert.same({ "1", "2" }, JS.keys(rows[1].workers), "streams on both workers")
    local want = {}
    for i = 1, 40 do want[#want + 1] = "message:s" .. i end
    assert.same({ [table.concat(want, ",")] = 20 }, rows[2].sequences)
  end)

  it("sse:subscribe(ch, fn): fn runs for every message, in order", function()
    local srv, port = start(nil, { workers = 2 })
    local rows = case(srv, port, "subscribe", "/sse/subfn", 20, "ssefn", 20)
    assert.same({ "1", "2" }, JS.keys(rows[1].workers), "streams on both workers")
    local want = {}
    for i = 1, 20 do want[#want + 1] = "pub:fn:s" .. i end
    assert.same({ [table.concat(want, ",")] = 20 }, rows[2].sequences)
  end)

  it("sse:last_event_id(): nil without the header, the Last-Event-ID header's value with it, and the last id seen on a reconnection", function()
    local srv, port = start()
    local rows = case(srv, port, "last")
    local plain = JS.find(rows, "name", "no header").events
    assert.equal("last", plain[1].event)
    assert.equal("nil", plain[1].data)
    assert.equal("nil", plain[2].data, "no last-event-id request header")
    local given = JS.find(rows, "name", "header 42").events
    assert.equal("42", given[1].data)
    assert.equal("42", given[2].data, "req.headers['last-event-id']")
    local re = JS.find(rows, "name", "reconnect")
    assert.truthy(re.first_last_id:match("^id%-%d+%-%d+$"), re.first_last_id)
    assert.equal(re.first_last_id, re.events[1].data)
  end)
end)
