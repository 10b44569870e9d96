-- Spec: mp.router, req:json and mp.json through the real binary (curl and
-- raw sockets), and the lua/moonport/ modules as the binary carries them:
-- tracebacks that name their files, MOONPORT_LUA_DIR loading from disk.
local H = require "spec.helper"
local cjson = require "cjson"

local start, cleanup = H.fixture_servers("router_app.lua")

local function curl(args)
  local p = assert(io.popen("/usr/bin/curl -s -i --max-time 10 " .. args .. " 2>&1"))
  local out = p:read("*a")
  p:close()
  local status = tonumber(out:match("^HTTP/1%.1 (%d+)"))
  local head, body = out:match("^(.-)\r\n\r\n(.*)$")
  local headers = {}
  for k, v in (head or ""):gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do headers[k:lower()] = v end
  return status, body, headers, out
end

describe("mp.router (end to end)", function()
  after_each(cleanup)
  local srv, port, sport
  before_each(function()
    sport = H.free_port()
    srv, port = start({ 1024, sport })
    H.wait_for(function() return srv:listens_on(sport) end, H.T(5), "the streaming port")
  end)

  it("routes by method and path, with :name and *splat parameters", function()
    local st, body = curl("http://127.0.0.1:" .. port .. "/")
    assert.equal(200, st)
    assert.equal("home", body)
    st, body = curl("http://127.0.0.1:" .. port .. "/users/42")
    assert.equal(200, st)
    assert.same({ id = "42", tags = {} }, cjson.decode(body))
    assert.truthy(body:find('"tags":[]', 1, true), body)
    st, body = curl("http://127.0.0.1:" .. port .. "/users/7/posts/hello")
    assert.equal(200, st)
    assert.equal("7/hello", body)
    st, body = curl("http://127.0.0.1:" .. port .. "/files/a/b/c.txt")
    assert.equal(200, st)
    assert.equal("file:a/b/c.txt", body)
    st = curl("-X DELETE http://127.0.0.1:" .. port .. "/users/7")
    assert.equal(204, st)
    st, body = curl("-X PATCH http://127.0.0.1:" .. port .. "/any")
    assert.equal(200, st)
    assert.equal("any PATCH", body)
  end)

  it("answers 404 for no route, 405 with Allow for a wrong method, 204 for OPTIONS", function()
    local st, body = curl("http://127.0.0.1:" .. port .. "/nope")
    assert.equal(404, st)
    assert.equal("Not Found\n", body)
    local h
    st, body, h = curl("-X PUT http://127.0.0.1:" .. port .. "/users/1")
    assert.equal(405, st)
    assert.equal("Method Not Allowed\n", body)
    assert.equal("DELETE, GET, HEAD, OPTIONS", h.allow)
    st, body, h = curl("-X OPTIONS http://127.0.0.1:" .. port .. "/users/1")
    assert.equal(204, st)
    assert.equal("", body)
    assert.equal("DELETE, GET, HEAD, OPTIONS", h.allow)
    st, body, h = curl("-I http://127.0.0.1:" .. port .. "/users/1")
    assert.equal(200, st)
    assert.equal("application/json", h["content-type"])
    assert.equal("", body)
  end)

  it("a route's error answers 500 and logs a traceback through lua/moonport files", function()
    local st = curl("http://127.0.0.1:" .. port .. "/boom")
    assert.equal(500, st)
    srv:wait_stderr("boom in a route", H.T(5), true)
    local err = srv:stderr()
    assert.truthy(err:find("router_app.lua:%d+: boom in a route"), err)
    assert.truthy(err:find("lua/moonport/http.lua:%d+:"), err)
    -- the lane keeps serving
    assert.equal(200, (curl("http://127.0.0.1:" .. port .. "/")))
  end)

  it("req:json decodes the body, or the handler gets nil and a message", function()
    local st, body = curl("-H 'Content-Type: application/json' --data-binary '{\"a\":[1,2],\"b\":{}}' http://127.0.0.1:"
      .. port .. "/echo")
    assert.equal(200, st)
    assert.same({ got = { a = { 1, 2 }, b = {} }, empty = {} }, cjson.decode(body))
    assert.truthy(body:find('"empty":[]', 1, true), body)
    st, body = curl("--data-binary '{\"a\":' http://127.0.0.1:" .. port .. "/echo")
    assert.equal(400, st)
    assert.truthy(body:find("^invalid JSON: "), body)
    st, body = curl("-X POST http://127.0.0.1:" .. port .. "/echo")
    assert.equal(400, st)
    assert.equal("empty body", body)
  end)

  it("a body over max_body never reaches req:json (413)", function()
    local big = ('{"x":"' .. ("y"):rep(2000) .. '"}')
    local file = H.tmpdir() .. "/big.json"
    local f = assert(io.open(file, "wb"))
    f:write(big)
    f:close()
    local st = curl("--data-binary @" .. file .. " http://127.0.0.1:" .. port .. "/echo")
    assert.equal(413, st)
  end)

  it("req:json reads a streamed body to its end, and stops at max_body", function()
    local sp = sport
    local c = H.connect(sp)
    local body = '{"k":"' .. ("v"):rep(300) .. '"}'
    H.send(c, "POST /stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for i = 1, #body, 100 do
      local piece = body:sub(i, i + 99)
      H.send(c, ("%x\r\n%s\r\n"):format(#piece, piece))
      H.sleep(0.02)
    end
    H.send(c, "0\r\n\r\n")
    local resp = H.read_until(c, "}", H.T(5))
    assert.truthy(resp:find("^HTTP/1.1 200"), resp)
    assert.same({ k = ("v"):rep(300) }, cjson.decode(resp:match("\r\n\r\n(.*)$")))
    c:close()
    local big = '{"k":"' .. ("v"):rep(3000) .. '"}'
    local st = curl("-H 'Transfer-Encoding: chunked' --data-binary '" .. big .. "' http://127.0.0.1:"
      .. sp .. "/stream")
    assert.is_true(st == 400 or st == 413, tostring(st))
  end)
end)

describe("lua/moonport modules", function()
  after_each(cleanup)

  it("MOONPORT_LUA_DIR loads a module from disk before the built-in copy", function()
    local dir = H.tmpdir()
    assert(os.execute("cp -r lua/moonport " .. dir .. "/"))
    local path = dir .. "/moonport/router.lua"
    local src = H.read_file(path)
    local changed = src:gsub('"Not Found\\n"', '"Not Found (from disk)\\n"')
    assert.are_not.equal(src, changed)
    local f = assert(io.open(path, "wb"))
    f:write(changed)
    f:close()
    local _, port = start(nil, { env = { MOONPORT_LUA_DIR = dir } })
    local st, body = curl("http://127.0.0.1:" .. port .. "/nope")
    assert.equal(404, st)
    assert.equal("Not Found (from disk)\n", body)
    -- the built-in copy without it
    local _, port2 = start()
    st, body = curl("http://127.0.0.1:" .. port2 .. "/nope")
    assert.equal(404, st)
    assert.equal("Not Found\n", body)
  end)

  it("a bad pattern is an error at the script's line", function()
    local script = H.tmpdir() .. "/bad_route.lua"
    local f = assert(io.open(script, "wb"))
    f:write('local mp = require "moonport"\nlocal r = mp.router()\nr:get("users", function() end)\n')
    f:close()
    local st, _, err = H.run { script }
    assert.equal(1, st)
    assert.truthy(err:find("bad_route.lua:3: mp.router: a pattern is a string that starts with /", 1, true), err)
  end)
end)
