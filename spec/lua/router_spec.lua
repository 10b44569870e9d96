-- Unit specs of lua/moonport/router.lua: no server, plain busted.
local router = require("moonport.router")

local function h(name) return function() return name end end

describe("mp.router match", function()
  local r
  before_each(function()
    r = router.new()
    r:get("/", h("root"))
    r:get("/users", h("list"))
    r:post("/users", h("create"))
    r:get("/users/new", h("new"))
    r:get("/users/:id", h("show"))
    r:delete("/users/:id", h("destroy"))
    r:get("/users/:id/posts/:post", h("post"))
    r:get("/files/*path", h("file"))
    r:all("/any", h("any"))
    r:get("/a/:x/c", h("axc"))
    r:get("/a/b/d", h("abd"))
  end)

  it("finds static routes by method", function()
    assert.equal("root", r:match("GET", "/")())
    assert.equal("list", r:match("GET", "/users")())
    assert.equal("create", r:match("POST", "/users")())
  end)

  it("ignores one trailing slash", function()
    assert.equal("list", r:match("GET", "/users/")())
    local fn, p = r:match("GET", "/users/7/")
    assert.equal("show", fn())
    assert.same({ id = "7" }, p)
  end)

  it("captures :name parameters", function()
    local fn, p = r:match("GET", "/users/42/posts/hello")
    assert.equal("post", fn())
    assert.same({ id = "42", post = "hello" }, p)
  end)

  it("prefers a literal segment to a parameter, and backtracks", function()
    assert.equal("new", r:match("GET", "/users/new")())
    assert.equal("abd", r:match("GET", "/a/b/d")())
    local fn, p = r:match("GET", "/a/b/c")
    assert.equal("axc", fn())
    assert.same({ x = "b" }, p)
  end)

  it("falls through from a static path to a parameter for another method", function()
    local fn, p = r:match("DELETE", "/users/new")
    assert.equal("destroy", fn())
    assert.same({ id = "new" }, p)
  end)

  it("captures the rest of the path in a splat, empty included", function()
    local fn, p = r:match("GET", "/files/a/b/c.txt")
    assert.equal("file", fn())
    assert.same({ path = "a/b/c.txt" }, p)
    fn, p = r:match("GET", "/files")
    assert.equal("file", fn())
    assert.same({ path = "" }, p)
  end)

  it("a parameter never matches an empty segment", function()
    assert.same({ nil, 404 }, { r:match("GET", "/users//posts/x") })
  end)

  it("answers HEAD with the GET handler", function()
    assert.equal("show", r:match("HEAD", "/users/1")())
  end)

  it("routes every method for r:all", function()
    assert.equal("any", r:match("PATCH", "/any")())
    assert.equal("any", r:match("BREW", "/any")())
  end)

  it("gives 404 for no route and 405 with Allow for a wrong method", function()
    assert.same({ nil, 404 }, { r:match("GET", "/nope") })
    assert.same({ nil, 404 }, { r:match("GET", "/users/1/posts") })
    assert.same({ nil, 405, "GET, HEAD, OPTIONS, POST" }, { r:match("PUT", "/users") })
    assert.same({ nil, 405, "DELETE, GET, HEAD, OPTIONS" }, { r:match("PUT", "/users/1") })
    -- static GET /users/new and dynamic /users/:id: both count
    assert.same({ nil, 405, "DELETE, GET, HEAD, OPTIONS" }, { r:match("PUT", "/users/new") })
  end)

  it("is not confused by a path without a leading slash", function()
    assert.same({ nil, 404 }, { r:match("GET", "users") })
    assert.same({ nil, 404 }, { r:match("GET", "") })
  end)
end)

describe("mp.router registration", function()
  it("refuses bad patterns and handlers with a clear error", function()
    local r = router.new()
    assert.has_error(function() r:get("users", h("x")) end,
      "mp.router: a pattern is a string that starts with / (got users)")
    assert.has_error(function() r:get("/a/*rest/b", h("x")) end,
      "mp.router: *splat must be last in /a/*rest/b")
    assert.has_error(function() r:get("/a/:", h("x")) end,
      "mp.router: bad parameter ':' in /a/:")
    assert.has_error(function() r:get("/a", "nope") end,
      "mp.router: the handler of /a must be a function (got string)")
    r:get("/a/:id", h("x"))
    assert.has_error(function() r:get("/a/:id", h("y")) end,
      "mp.router: GET /a/:id is already routed")
    assert.has_error(function() r:post("/a/:name", h("y")) end,
      "mp.router: /a/:name names its parameters differently from a route already on the same path")
    assert.has_error(function() r:route("get", "/b", h("y")) end,
      "mp.router: a method is an upper-case token (got get)")
  end)

  it("chains", function()
    local r = router.new():get("/x", h("x")):post("/y", h("y"))
    assert.equal("x", r:match("GET", "/x")())
    assert.equal("y", r:match("POST", "/y")())
  end)

  it("routes custom methods with r:route", function()
    local r = router.new():route("PROPFIND", "/dav/*", h("dav"))
    local fn, p = r:match("PROPFIND", "/dav/a/b")
    assert.equal("dav", fn())
    assert.same({ splat = "a/b" }, p)
  end)
end)

describe("mp.router as a handler", function()
  local function fake_res()
    local res = { headers = {} }
    function res:status(s) self.code = s return self end
    function res:header(k, v) self.headers[k] = v return self end
    function res:send(b) self.body = b or "" return self end
    return res
  end

  it("sets req.params and calls the handler", function()
    local r = router.new()
    r:get("/u/:id", function(req, res) res:send("user " .. req.params.id) end)
    local req, res = { method = "GET", path = "/u/9" }, fake_res()
    r(req, res)
    assert.equal("user 9", res.body)
    assert.same({ id = "9" }, req.params)
  end)

  it("answers 404, 405 with Allow, and OPTIONS with 204", function()
    local r = router.new():get("/x", h("x"))
    local res = fake_res()
    r({ method = "GET", path = "/y" }, res)
    assert.equal(404, res.code)
    res = fake_res()
    r({ method = "POST", path = "/x" }, res)
    assert.equal(405, res.code)
    assert.equal("GET, HEAD, OPTIONS", res.headers.Allow)
    res = fake_res()
    r({ method = "OPTIONS", path = "/x" }, res)
    assert.equal(204, res.code)
    assert.equal("GET, HEAD, OPTIONS", res.headers.Allow)
  end)

  it("uses r:not_found", function()
    local r = router.new():not_found(function(_, res) res:status(404):send("custom") end)
    local res = fake_res()
    r({ method = "GET", path = "/y" }, res)
    assert.equal("custom", res.body)
  end)

  it("gives a plain function with r:handler", function()
    local r = router.new():get("/x", function(_, res) res:send("ok") end)
    local f = r:handler()
    assert.equal("function", type(f))
    local res = fake_res()
    f({ method = "GET", path = "/x" }, res)
    assert.equal("ok", res.body)
  end)
end)
