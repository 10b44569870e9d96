-- mp.limit through the real binary (spec/fixtures/limit_app.lua) across
-- -w 2 -t 2: a rate limit exact to the request with an honest
-- Retry-After, and concurrency slots given back on error and on client
-- abort (clients: Node's http Agent, curl, raw sockets).
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local function curl(args)
  local p = assert(io.popen("/usr/bin/curl -s --max-time " .. math.ceil(H.T(20)) ..
    " -D - " .. args .. " 2>/dev/null"))
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("^HTTP/1%.1 (%d+)")), out:match("\r\n\r\n(.*)$"), out
end

describe("mp.limit across -w 2 -t 2", function()
  local start, cleanup = H.fixture_servers("limit_app.lua")
  local up, port, app
  setup(function()
    up = H.spawn({ JS.node, JS.dir .. "/proxy_upstream.js", "u" })
    up.sanitizer_checked = true
    local uport = cjson.decode(up:wait_stdout("{[^\n]*}", H.T(10))).port
    app, port = start({ uport }, { workers = 2, threads = 2 })
  end)
  teardown(function()
    if up:alive() then up:kill(H.SIGKILL) end
    cleanup()
  end)

  it("passes exactly burst + 1 of 400 requests at one instant, the rest get 429 with Retry-After", function()
    local rows = JS.exec("proxy_load.js", { port, "/rate", 400, 16, "GET", "x-key=k1" }, 60)
    local r = assert(rows[1], "no output from proxy_load.js")
    assert.same({ ["200"] = 50, ["429"] = 350 }, r.status)
    assert.equal(0, r.errors)
    -- the next pass is one interval (60 s) away
    local code, _, head = curl(("-H 'X-Key: k1' 'http://127.0.0.1:%d/rate'"):format(port))
    assert.equal(429, code)
    local ra = tonumber(head:match("\r\n[Rr]etry%-[Aa]fter: (%d+)"))
    assert.is_true(ra >= 59 and ra <= 60, "Retry-After " .. tostring(ra))
    -- another key has its own budget
    assert.equal(200, (curl(("-H 'X-Key: k2' 'http://127.0.0.1:%d/rate'"):format(port))))
  end)

  it("lim:take's retry time is honest: waiting it out passes", function()
    for _, key in ipairs { "a", "b", "c" } do
      local _, body = curl(("'http://127.0.0.1:%d/take?k=%s&rate=2'"):format(port, key))
      assert.is_true(cjson.decode(body).ok)
      _, body = curl(("'http://127.0.0.1:%d/take?k=%s&rate=2'"):format(port, key))
      local t = cjson.decode(body)
      assert.is_false(t.ok)
      assert.equal("rejected", t.err)
      assert.is_true(t.retry > 0 and t.retry <= 500, "retry " .. t.retry)
      H.sleep(t.retry / 1000 + 0.01)
      _, body = curl(("'http://127.0.0.1:%d/take?k=%s&rate=2'"):format(port, key))
      assert.is_true(cjson.decode(body).ok, body)
    end
  end)

  it("gives concurrency slots back when the handler raises", function()
    for _ = 1, 5 do
      assert.equal(500, (curl(("-H 'X-Key: e' 'http://127.0.0.1:%d/conc?err=1'"):format(port))))
    end
    assert.equal(200, (curl(("-H 'X-Key: e' 'http://127.0.0.1:%d/conc'"):format(port))))
  end)

  it("gives concurrency slots back when the client goes away", function()
    local function hold()
      local c = H.connect(port)
      H.send(c, "GET /conc?hold=1 HTTP/1.1\r\nHost: x\r\nX-Key: z\r\n\r\n")
      return c
    end
    local c1, c2 = hold(), hold()
    -- both slots taken: the third is refused (both holders are at the upstream)
    H.wait_for(function()
      return (curl(("-H 'X-Key: z' 'http://127.0.0.1:%d/conc'"):format(port))) == 429
    end, H.T(10), "the third refused")
    c1:close()
    c2:close()
    H.wait_for(function()
      return (curl(("-H 'X-Key: z' 'http://127.0.0.1:%d/conc'"):format(port))) == 200
    end, H.T(10), "the slots back after the clients left")
    assert.truthy(app:alive())
  end)
end)
