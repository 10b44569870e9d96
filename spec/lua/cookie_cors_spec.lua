-- Unit specs of lua/moonport/cookie.lua and cors.lua: no server, plain
-- busted (the end-to-end ones are spec/e2e/webapp_spec.lua and
-- webapp_browser_spec.lua).
local cookie = require("moonport.cookie")
local cors = require("moonport.cors")

describe("cookie.parse", function()
  it("splits on ';', trims spaces and tabs, keeps the first value, skips bad pairs", function()
    assert.same({ a = "1", b = "x=y", c = "" },
      cookie.parse(" a=1;\tb=x=y ; a=2; ;=v; d e=1; c=; f=\"q\"z; g=\\\\"))
    assert.same({}, cookie.parse(nil))
    assert.same({}, cookie.parse(""))
    assert.same({ q = "quoted" }, cookie.parse('q="quoted"'))
  end)
end)

describe("cookie.header", function()
  it("writes the attributes in a fixed order", function()
    assert.equal("a=b; Path=/; Domain=example.com; Max-Age=0; Expires=Sun, 09 Sep 2001 01:46:40 GMT; " ..
      "Secure; HttpOnly; SameSite=Strict; Partitioned",
      cookie.header("a", "b", { domain = "example.com", max_age = 0, expires = 1e9, secure = true,
        http_only = true, same_site = "strict", partitioned = true }))
    assert.equal("n=5", cookie.header("n", 5, { path = false }))
  end)

  it("raises for what a header can't carry or a browser would drop", function()
    local bad = {
      { "a b", "v" }, { "a;", "v" }, { "", "v" }, { "a", "v v" }, { "a", "v,w" }, { "a", "v\r\n" },
      { "a", "\"q\"" }, { "a", "\200" }, { "a", {} },
      { "a", "v", { max_age = 1.5 } }, { "a", "v", { expires = "today" } },
      { "a", "v", { path = "/x;y" } }, { "a", "v", { domain = "" } },
      { "a", "v", { same_site = "lax-ish" } }, { "a", "v", { same_site = "None" } },
      { "a", "v", { partitioned = true } }, { "a", "v", { maxage = 1 } }, { "a", "v", "opts" },
    }
    for i, args in ipairs(bad) do
      assert.has_error(function() cookie.header(args[1], args[2], args[3]) end, nil, "case " .. i)
    end
  end)
end)

-- a req and a res that record what the middleware did
local function exchange(method, headers)
  local res = { status_ = nil, h = {}, sent_ = false }
  function res:header(k, v)
    self.h[#self.h + 1] = k .. ": " .. v
    return self
  end
  function res:status(s) self.status_ = s return self end
  function res:send() self.sent_ = true return true end
  return { method = method, headers = headers }, res
end

describe("mp.cors", function()
  local mw = cors.new { origins = { "https://a.example", "*.b.example", "http://*.c.example" } }

  local function allowed(origin)
    local req, res = exchange("GET", { origin = origin })
    mw(req, res)
    for _, line in ipairs(res.h) do
      if line == "Access-Control-Allow-Origin: " .. origin then return true end
    end
    return false
  end

  it("matches exact origins without case, and subdomain patterns by scheme", function()
    assert.is_true(allowed("https://a.example"))
    assert.is_true(allowed("HTTPS://A.EXAMPLE"))
    assert.is_true(allowed("https://x.b.example"))
    assert.is_true(allowed("http://x.y.b.example"))
    assert.is_true(allowed("http://x.c.example"))
    for _, o in ipairs({ "https://a.example.evil", "https://b.example", "https://xb.example",
        "https://x.b.example.evil", "https://c.example", "https://x.c.example", "http://u@x.b.example",
        "http://evil/.b.example", "null", "https://x.b.example:8443" }) do
      assert.is_false(allowed(o), o)
    end
  end)

  it("'*' answers '*' without Vary; with credentials it raises", function()
    local any = cors.new { origins = "*" }
    local req, res = exchange("GET", { origin = "https://z.example" })
    any(req, res)
    assert.same({ "Access-Control-Allow-Origin: *" }, res.h)
    assert.has_error(function() cors.new { origins = "*", credentials = true } end)
    assert.has_error(function() cors.new { origins = {} } end)
    assert.has_error(function() cors.new { origins = { "https://a/" } } end)
    assert.has_error(function() cors.new { origins = "*", max_age = -1 } end)
  end)

  it("a preflight is answered with the requested headers echoed when none are configured", function()
    local req, res = exchange("OPTIONS", { origin = "https://a.example",
      ["access-control-request-method"] = "PUT", ["access-control-request-headers"] = "x-a, x-b" })
    mw(req, res)
    assert.equal(204, res.status_)
    assert.is_true(res.sent_)
    assert.same({ "Vary: Origin", "Access-Control-Allow-Origin: https://a.example",
      "Access-Control-Allow-Methods: GET, HEAD, PUT, PATCH, POST, DELETE",
      "Access-Control-Allow-Headers: x-a, x-b", "Vary: Access-Control-Request-Headers" }, res.h)
  end)
end)
