-- Spec: cookies (req.cookies, res:cookie), router middleware (r:use,
-- r:after, r:on_error, r:not_found, r:method_not_allowed), mp.cors and
-- request ids (mp.http request_id = true) through the real binary, with
-- curl as the client.
local H = require "spec.helper"
local cjson = require "cjson"

local start, cleanup = H.fixture_servers("webapp_app.lua")

-- curl with -i: status, body, headers (lower-case names; a repeated one
-- is a list in headers_all), the raw output
local function curl(args)
  local p = assert(io.popen("/usr/bin/curl -s -i --max-time 10 " .. args .. " 2>&1"))
  local out = p:read("*a")
  p:close()
  local status = tonumber(out:match("^HTTP/1%.1 (%d+)"))
  local head, body = out:match("^(.-)\r\n\r\n(.*)$")
  local headers, all = {}, {}
  for k, v in (head or ""):gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do
    k = k:lower()
    headers[k] = v
    all[k] = all[k] or {}
    table.insert(all[k], v)
  end
  return status, body, headers, all, out
end

describe("web app pieces (end to end)", function()
  after_each(cleanup)
  local srv, port, plain, url, access
  before_each(function()
    plain = H.free_port()
    access = H.tmpdir() .. "/access.log"
    srv, port = start({ plain }, { options = { "--log", access } })
    H.wait_for(function() return srv:listens_on(plain) end, H.T(5), "the plain port")
    url = "http://127.0.0.1:" .. port
  end)

  describe("cookies", function()
    it("req.cookies parses the Cookie header: first value wins, bad pairs skipped, quotes dropped", function()
      local st, body = curl("-H 'Cookie: a=1; b=\"two\"; a=3; junk; c d=4; e=x y; ok=yes' " .. url .. "/cookies")
      assert.equal(200, st)
      assert.same({ a = "1", b = "two", ok = "yes" }, cjson.decode(body))
      st, body = curl(url .. "/cookies")
      assert.equal(200, st)
      assert.same({}, cjson.decode(body))
    end)

    it("res:cookie sets one Set-Cookie header per call with its attributes", function()
      local st, body, _, all = curl(url .. "/set")
      assert.equal(200, st)
      assert.equal("set", body)
      local sc = all["set-cookie"]
      assert.equal(3, #sc)
      assert.equal("sid=abc123; Path=/; Max-Age=3600; HttpOnly; SameSite=Lax", sc[1])
      assert.equal("theme=dark; Path=/settings; Expires=Thu, 01 Jan 1970 00:00:00 GMT", sc[2])
      assert.equal("cross=1; Path=/; Secure; SameSite=None; Partitioned", sc[3])
    end)

    it("a value with ';' or CR/LF raises at the caller's line, and nothing of it is sent", function()
      local st, body, h = curl(url .. "/bad-cookie")
      assert.equal(200, st)
      local v = cjson.decode(body)
      assert.is_false(v.ok)
      assert.is_false(v.ok2)
      assert.truthy(v.err2:find("webapp_app.lua:%d+: res:cookie: the value of sid"), v.err2)
      assert.truthy(v.err:find("res:cookie: the value of sid", 1, true), v.err)
      assert.is_nil(h["set-cookie"])
    end)
  end)

  describe("router middleware", function()
    it("r:use runs in order, a prefix limits it, and one that answers ends the request", function()
      local st, body, h = curl(url .. "/api/order")
      assert.equal(200, st)
      assert.same({ order = { "first", "api" } }, cjson.decode(body))
      assert.equal("1", h["x-mw"])
      st, body, h = curl("-H 'X-Token: stop' " .. url .. "/api/order")
      assert.equal(401, st)
      assert.same({ error = "token" }, cjson.decode(body))
      assert.equal("1", h["x-mw"])
      -- /apiary is not under /api
      st = curl("-H 'X-Token: stop' " .. url .. "/apiary")
      assert.equal(404, st)
    end)

    it("r:not_found and r:method_not_allowed answer in the app's format", function()
      local st, body, h = curl(url .. "/nope")
      assert.equal(404, st)
      assert.same({ error = "no such page", path = "/nope" }, cjson.decode(body))
      assert.equal("application/json", h["content-type"])
      st, body, h = curl("-X DELETE " .. url .. "/cookies")
      assert.equal(405, st)
      assert.same({ error = "method", allow = "GET, HEAD, OPTIONS" }, cjson.decode(body))
      assert.equal("GET, HEAD, OPTIONS", h.allow)
    end)

    it("r:on_error answers a handler's error; the error is logged with its request", function()
      local st, body, h = curl("-H 'X-Request-Id: trace-42' " .. url .. "/boom")
      assert.equal(500, st)
      assert.same({ error = "oops", id = "trace-42" }, cjson.decode(body))
      assert.equal("yes", h["x-kept"])
      srv:wait_stderr("boom in a handler", H.T(5), true)
      local err = srv:stderr()
      assert.truthy(err:find("GET /boom %[trace%-42%]: .-webapp_app.lua:%d+: boom in a handler"), err)
    end)

    it("r:after runs after the answer; its error is logged and the answer stands", function()
      local st, body = curl(url .. "/after-log")
      assert.equal(200, st)
      assert.equal("logged", body)
      srv:wait_stderr("after hook: GET /after%-log sent=true", H.T(5))
      st, body = curl(url .. "/after-boom")
      assert.equal(200, st)
      assert.equal("fine", body)
      srv:wait_stderr("boom in after", H.T(5), true)
      assert.equal(200, (curl(url .. "/api/order")))
    end)
  end)

  describe("the server's 500", function()
    it("keeps the headers the handler set (not its Content-Type) and logs method, target, client and id", function()
      local st, body, h = curl("-H 'X-Request-Id: raw-7' " .. url .. "/boom-raw?x=1")
      assert.equal(500, st)
      assert.equal("Internal Server Error\n", body)
      assert.equal("yes", h["x-kept"])
      assert.equal("raw-7", h["x-request-id"])
      assert.equal("text/plain; charset=utf-8", h["content-type"])
      srv:wait_stderr("raw boom", H.T(5), true)
      local err = srv:stderr()
      assert.truthy(err:find("error in on_request: GET /boom%-raw%?x=1 from 127%.0%.0%.1:%d+ " ..
        "%(request id raw%-7%): .-webapp_app.lua:%d+: raw boom"), err)
      -- without request_id, the error line still names a made id
      st, body, h = curl("http://127.0.0.1:" .. plain .. "/boom")
      assert.equal("Internal Server Error\n", body)
      assert.equal(500, st)
      assert.equal("plain", h["x-kept"])
      assert.is_nil(h["x-request-id"])
      srv:wait_stderr("plain boom", H.T(5), true)
      assert.truthy(srv:stderr():find("error in on_request: GET /boom from 127%.0%.0%.1:%d+ " ..
        "%(request id %x+%-%x+%): .-plain boom"), srv:stderr())
    end)
  end)

  describe("request ids", function()
    it("a sane X-Request-Id is kept, another is replaced; it goes back and onto the access log", function()
      local st, body, h = curl("-H 'X-Request-Id: abc-123.x_y' " .. url .. "/id")
      assert.equal(200, st)
      assert.equal("abc-123.x_y", body)
      assert.equal("abc-123.x_y", h["x-request-id"])
      st, body, h = curl("-H 'X-Request-Id: bad id\"<script>' " .. url .. "/id")
      assert.equal(200, st)
      assert.truthy(body:find("^%x+%-%x+$"), body)
      assert.equal(body, h["x-request-id"])
      local made = body
      st, body = curl("-H 'X-Request-Id: " .. ("a"):rep(65) .. "' " .. url .. "/id")
      assert.equal(200, st)
      assert.truthy(body:find("^%x+%-%x+$"), body)
      assert.not_equal(made, body)
      H.wait_for(function()
        local log = H.read_file(access) or ""
        return log:find('"GET /id HTTP/1.1" 200 11 "%-" "curl/[^"]*" %d+%.%d+ abc%-123%.x_y\n')
          and log:find(" " .. made .. "\n", 1, true)
      end, H.T(5), function() return "the ids on the access log: " .. tostring(H.read_file(access)) end)
      -- without request_id: req.id is made, nothing goes back, the log line has no id
      st, body, h = curl("http://127.0.0.1:" .. plain .. "/id")
      assert.equal(200, st)
      assert.truthy(body:find("^%x+%-%x+$"), body)
      assert.is_nil(h["x-request-id"])
    end)
  end)

  describe("mp.cors", function()
    it("answers a preflight from an allowed origin with Access-Control-* and Vary: Origin", function()
      local st, body, h, all = curl("-X OPTIONS -H 'Origin: http://allowed.example' " ..
        "-H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: content-type' " ..
        url .. "/api/data")
      assert.equal(204, st)
      assert.equal("", body)
      assert.equal("http://allowed.example", h["access-control-allow-origin"])
      assert.equal("true", h["access-control-allow-credentials"])
      assert.equal("GET, HEAD, PUT, PATCH, POST, DELETE", h["access-control-allow-methods"])
      assert.equal("Content-Type, X-Token", h["access-control-allow-headers"])
      assert.equal("600", h["access-control-max-age"])
      assert.same({ "Origin" }, all.vary)
    end)

    it("a subdomain pattern matches; another origin gets no Access-Control-Allow-Origin", function()
      local st, _, h = curl("-H 'Origin: https://app.sub.example' " .. url .. "/api/order")
      assert.equal(200, st)
      assert.equal("https://app.sub.example", h["access-control-allow-origin"])
      assert.equal("X-Request-Id", h["access-control-expose-headers"])
      assert.equal("Origin", h.vary)
      for _, o in ipairs({ "http://evil.example", "https://sub.example", "https://x.sub.example.evil",
          "https://evil.com/.sub.example", "null" }) do
        st, _, h = curl("-H 'Origin: " .. o .. "' " .. url .. "/api/order")
        assert.equal(200, st)
        assert.is_nil(h["access-control-allow-origin"], o)
        assert.equal("Origin", h.vary)
      end
      st, _, h = curl("-X OPTIONS -H 'Origin: http://evil.example' -H 'Access-Control-Request-Method: POST' " ..
        url .. "/api/data")
      assert.equal(204, st)
      assert.is_nil(h["access-control-allow-origin"])
      assert.is_nil(h["access-control-allow-methods"])
    end)
  end)

  describe("error_pages", function()
    local pstart, pcleanup = H.fixture_servers("pages_app.lua")
    after_each(pcleanup)
    local psrv, pport, pub, f500, dir
    before_each(function()
      dir = H.tmpdir()
      for name, text in pairs({ ["400.html"] = "<h1>bad</h1>", ["404.html"] = "<h1>nothing here</h1>",
          ["413.json"] = '{"error":"too big"}', ["408.txt"] = "too slow", ["431.html"] = "<h1>headers</h1>",
          ["500.html"] = "<h1>sorry</h1>" }) do
        H.write_file(dir .. "/" .. name, text)
      end
      assert(require("lfs").mkdir(dir .. "/pub"))
      H.write_file(dir .. "/pub/index.html", "home")
      pub, f500 = H.free_port(), H.free_port()
      psrv, pport = pstart({ pub, f500, dir })
      H.wait_for(function() return psrv:listens_on(pub) and psrv:listens_on(f500) end, H.T(5), "the ports")
    end)

    it("C's answers (400, 413, 431) and a public folder's 404 use the pages' files", function()
      local base = "http://127.0.0.1:" .. pport
      local st, body, h = curl("--data-binary @/dev/null -H 'Content-Length: 1000' " .. base .. "/")
      assert.equal(413, st)
      assert.equal('{"error":"too big"}', body)
      assert.equal("application/json", h["content-type"])
      st, body, h = curl("-H 'X-Big: " .. ("b"):rep(1100) .. "' " .. base .. "/")
      assert.equal(431, st)
      assert.equal("<h1>headers</h1>", body)
      assert.equal("text/html; charset=utf-8", h["content-type"])
      st, body = curl("-H 'Host: a b' " .. base .. "/")
      assert.equal(400, st)
      assert.equal("<h1>bad</h1>", body)
      -- a head that never ends: 408 with its page, when header_timeout (2 s) passes
      local c = H.connect(pport)
      assert.is_true(H.send(c, "GET / HTTP/1.1\r\nHost: x\r\n"))
      local text = assert(H.read_to_eof(c, H.T(20)))
      assert.truthy(text:find("^HTTP/1%.1 408 "), text)
      assert.truthy(text:find("\r\n\r\ntoo slow$"), text)
      -- a multipart 400 raised by req:parts() takes the file too
      st, body = curl("-H 'Content-Type: multipart/form-data; boundary=zz' --data-binary junk " .. base .. "/parts")
      assert.equal(400, st)
      assert.equal("<h1>bad</h1>", body)
      st, body, h = curl("http://127.0.0.1:" .. pub .. "/missing.txt")
      assert.equal(404, st)
      assert.equal("<h1>nothing here</h1>", body)
      assert.equal("text/html; charset=utf-8", h["content-type"])
      st, body = curl("-I http://127.0.0.1:" .. pub .. "/missing.txt")
      assert.equal(404, st)
      assert.equal("", body)
      st, body = curl("http://127.0.0.1:" .. pub .. "/")
      assert.equal(200, st)
      assert.equal("home", body)
    end)

    it("a handler's error: the 500 page (a function or a file), logged with the request", function()
      local st, body, h = curl("-H 'X-Request-Id: pg-1' http://127.0.0.1:" .. pport .. "/boom")
      assert.equal(500, st)
      assert.same({ error = "custom", id = "pg-1", had = false }, cjson.decode(body))
      assert.equal("application/json", h["content-type"])
      psrv:wait_stderr("boom for a page", H.T(5), true)
      assert.truthy(psrv:stderr():find("error in on_request: GET /boom from 127%.0%.0%.1:%d+ %(request id pg%-1%): " ..
        "[^\n]*pages_app.lua:%d+: boom for a page"), psrv:stderr())
      local all
      st, body, h, all = curl("-H 'X-Request-Id: pg-2' http://127.0.0.1:" .. f500 .. "/x")
      assert.equal(500, st)
      assert.equal("<h1>sorry</h1>", body)
      assert.same({ "text/html; charset=utf-8" }, all["content-type"])
      assert.equal("1", h["x-kept"])
      assert.equal("pg-2", h["x-request-id"])
      psrv:wait_stderr("(request id pg-2): ", H.T(5), true)
    end)
  end)
end)
