-- mp.tcp inside an mp.http handler calling a Node `http` upstream by hand
-- (spec/fixtures/tcp_http_app.lua, spec/node/http_upstream.js): the
-- lane's pool reuses one upstream connection, which the upstream's own
-- connection count shows; chunked bodies read with *l and n.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local function get(port, target)
  local c = H.connect(port)
  H.send(c, ("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):format(target))
  local data = H.read_to_eof(c, H.T(5))
  c:close()
  assert.truthy(data, "no response to " .. target)
  return tonumber(data:match("^HTTP/1%.1 (%d%d%d)")), data:match("\r\n\r\n(.*)$"),
         data:match("\r\n[xX]%-[rR]eused: (%d+)")
end

describe("mp.tcp to a Node http upstream", function()
  local app, node, port, nport
  setup(function()
    node = H.spawn({ JS.node, JS.dir .. "/http_upstream.js" })
    nport = cjson.decode(node:wait_stdout("{[^\n]*}", H.T(10))).port
    port = H.free_port()
    app = H.start("tcp_http_app.lua", { args = { port }, wait_port = port, threads = 1 })
  end)
  teardown(function()
    assert.equal(0, app:stop())
    H.cleanup()
  end)

  it("three requests through the pool: one upstream connection, reuse counted", function()
    for i = 0, 2 do
      local st, body, reused = get(port, "/up?port=" .. nport .. "&path=/hello")
      assert.equal(200, st)
      assert.equal("hello from node", body)
      assert.equal(tostring(i), reused)
    end
    local st, body = get(port, "/up?port=" .. nport .. "&path=/conns")
    assert.equal(200, st)
    assert.equal("1", body)
  end)

  it("reads a chunked body", function()
    local st, body = get(port, "/up?port=" .. nport .. "&path=/chunked")
    assert.equal(200, st)
    assert.equal("abc", body)
  end)

  it("a dead upstream is a 502 with the error", function()
    local st, body = get(port, "/up?port=" .. H.free_port() .. "&path=/hello")
    assert.equal(502, st)
    assert.equal("connection refused", body)
  end)
end)
