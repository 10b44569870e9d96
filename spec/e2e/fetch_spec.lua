-- mp.fetch inside an mp.http handler (spec/fixtures/fetch_app.lua) calling
-- a Node `http` upstream (spec/node/http_upstream.js) and Python's
-- http.server: body framings, redirects, limits, bad upstreams (each a
-- clear nil, err while the lane keeps serving), the keep-alive pool seen
-- in the upstream's connection count, three fetches side by side.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local function esc(s)
  return (tostring(s):gsub("[^%w%-_.~/]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function get(port, target) return H.get_json(port, target, H.T(10)) end

describe("mp.fetch", function()
  local app, node, port, base, pyport
  local function fetch(path, opts)
    local q = { "/f?url=" .. esc(path:match("^http") and path or base .. path) }
    for k, v in pairs(opts or {}) do q[#q + 1] = k .. "=" .. esc(v) end
    return get(port, table.concat(q, "&"))
  end
  local function conns() return tonumber(fetch("/conns").body) end

  setup(function()
    node = H.spawn({ JS.node, JS.dir .. "/http_upstream.js" })
    base = "http://127.0.0.1:" .. cjson.decode(node:wait_stdout("{[^\n]*}", H.T(10))).port
    local dir = H.tmpdir()
    local f = assert(io.open(dir .. "/file.txt", "w"))
    f:write("a file served by python\n")
    f:close()
    pyport = H.free_port()
    H.spawn({ "/usr/bin/python3", "-m", "http.server", tostring(pyport), "--bind", "127.0.0.1",
              "--directory", dir })
    H.wait_for(function() return H.is_listening(pyport) end, H.T(10), "python http.server")
    port = H.free_port()
    app = H.start("fetch_app.lua", { args = { port }, wait_port = port, threads = 1 })
  end)
  teardown(function()
    assert.equal(0, app:stop())
    H.cleanup()
  end)

  it("GET with Content-Length; headers lower-case; Host and User-Agent sent", function()
    local r = fetch("/hello")
    assert.equal(200, r.status)
    assert.equal("hello from node", r.body)
    assert.equal("text/plain", r.headers["content-type"])
    local e = cjson.decode(fetch("/echo", { hdr = "yes" }).body)
    assert.equal("GET", e.method)
    assert.equal(base:match("//(.*)$"), e.headers.host)
    assert.truthy(e.headers["user-agent"]:match("^moonport/%d"))
    assert.equal("yes", e.headers["x-test"])
    -- no header injection: a CR or LF in a value is refused before sending
    assert.equal("bad header value for X-Test", fetch("/echo", { hdr = "a\r\nX-Evil: 1" }).err)
    -- nor any control byte but HTAB (as the server refuses them)
    for _, v in ipairs { "a\11b", "a\127b", "a\0b", "a\27b" } do
      assert.equal("bad header value for X-Test", fetch("/echo", { hdr = v }).err, ("%q"):format(v))
    end
    assert.equal("a\tb", cjson.decode(fetch("/echo", { hdr = "a\tb" }).body).headers["x-test"])
  end)

  it("POST with a string body and with a body function (chunked)", function()
    local e = cjson.decode(fetch("/echo", { method = "POST", body = "payload" }).body)
    assert.same({ "POST", "payload", "7" }, { e.method, e.body, e.headers["content-length"] })
    e = cjson.decode(fetch("/echo", { method = "POST", pieces = 1 }).body)
    assert.same({ "POST", "one,two,three", "chunked" },
                { e.method, e.body, e.headers["transfer-encoding"] })
  end)

  it("chunked, close-delimited, 204, 304, HEAD, a 100 skipped, repeated fields joined", function()
    assert.equal("abc", fetch("/chunked").body)
    assert.equal("until the close", fetch("/close").body)
    local r = fetch("/s204")
    assert.same({ 204, "" }, { r.status, r.body })
    r = fetch("/s304")
    assert.same({ 304, "", '"v1"' }, { r.status, r.body, r.headers.etag })
    r = fetch("/head", { method = "HEAD" })
    assert.same({ 200, "", "11" }, { r.status, r.body, r.headers["content-length"] })
    r = fetch("/interim")
    assert.same({ 200, "final" }, { r.status, r.body })
    assert.equal("one, two", fetch("/multi").headers["x-multi"])
  end)

  it("keep-alive: the pool reuses one upstream connection; Connection: close is not pooled", function()
    local n0 = conns()
    for _ = 1, 5 do assert.equal("hello from node", fetch("/hello").body) end
    assert.equal(n0, conns())
    assert.equal("bye", fetch("/connclose").body)
    local n1 = conns()
    assert.equal(n0 + 1, n1) -- the closed one was not taken again
    assert.equal(n1, conns())
  end)

  it("a pooled connection dead on reuse: retried once on a fresh one for GET, not for POST", function()
    -- /arm makes the upstream drop the next request on that connection,
    -- the race of a server closing an idle connection as a request comes.
    fetch("/arm")
    local n = conns() -- the pooled one dropped it; retried on a new one
    fetch("/arm")
    local r = fetch("/hello")
    assert.same({ 200, "hello from node" }, { r.status, r.body })
    assert.equal(n + 1, conns()) -- one new connection for the retry, then pooled
    fetch("/arm")
    r = fetch("/echo", { method = "POST", body = "x" })
    assert.equal("closed", r.err)
    assert.equal(n + 2, conns()) -- the lane goes on, on a new connection
  end)

  it("redirects: off by default; 301 relative, 302 absolute and 303 turn into GET; 307/308 keep the method and body", function()
    local r = fetch("/r301")
    assert.same({ 301, "/hello" }, { r.status, r.headers.location })
    r = fetch("/r301", { follow = 1 })
    assert.same({ 200, "hello from node", base .. "/hello" }, { r.status, r.body, r.url })
    local e = cjson.decode(fetch("/r302", { follow = 1, method = "POST", body = "b" }).body)
    assert.same({ "GET", "", "/echo?from=302" }, { e.method, e.body, e.url })
    e = cjson.decode(fetch("/r303", { follow = "true", method = "POST", body = "b" }).body)
    assert.same({ "GET", "/echo?from=303" }, { e.method, e.url })
    e = cjson.decode(fetch("/r307", { follow = 1, method = "POST", body = "kept" }).body)
    assert.same({ "POST", "kept", "/echo?from=307" }, { e.method, e.body, e.url })
    e = cjson.decode(fetch("/r308", { follow = 1, method = "PUT", body = "put" }).body)
    assert.same({ "PUT", "put", "/echo?from=308" }, { e.method, e.body, e.url })
  end)

  it("a redirect to another origin drops Authorization, Proxy-Authorization and Cookie (redirect_headers = \"drop\": every field of the caller's); the same origin keeps them", function()
    local e = cjson.decode(fetch("/r307", { follow = 1, creds = 1 }).body)
    assert.same({ "Basic YTpi", "Basic cDpx", "c=1", "k" },
      { e.headers.authorization, e.headers["proxy-authorization"], e.headers.cookie, e.headers["x-api-key"] })
    e = cjson.decode(fetch("/away", { follow = 1, creds = 1 }).body)
    assert.equal("/echo?from=away", e.url)
    assert.same({ "localhost", "k" }, { e.headers.host:match("^[^:]*"), e.headers["x-api-key"] })
    assert.is_nil(e.headers.authorization)
    assert.is_nil(e.headers["proxy-authorization"])
    assert.is_nil(e.headers.cookie)
    e = cjson.decode(fetch("/away", { follow = 1, creds = 1, rh = "drop", hdr = "t" }).body)
    assert.is_nil(e.headers["x-api-key"])
    assert.is_nil(e.headers["x-test"])
    assert.is_nil(e.headers.authorization)
  end)

  it("deny / allow: checked on each address a lookup gives and on every redirect hop, before the connect; nothing reaches a refused one", function()
    local n0 = conns()
    local p = base:match(":(%d+)$")
    assert.equal("address refused: 127.0.0.1 (loopback)", fetch("/hello", { deny = "loopback" }).err)
    assert.equal("address refused: 127.0.0.1 (127.0.0.0/8)", fetch("/hello", { deny = "10.0.0.0/8,127.0.0.0/8" }).err)
    -- the IPv4-mapped form is the same address; a name is checked on what it resolves to
    assert.equal("address refused: ::ffff:127.0.0.1 (loopback)",
      fetch("http://[::ffff:127.0.0.1]:" .. p .. "/hello", { deny = "loopback" }).err)
    local e = fetch("http://localhost:" .. p .. "/hello", { deny = "loopback" }).err
    assert.truthy(e:find("^address refused: [%x:.]+ %(loopback%)$"), e)
    assert.equal(n0, conns(), "a refused address was connected to")
    -- allowed: served; a redirect hop is checked anew
    assert.equal(200, fetch("/hello", { deny = "private,link-local" }).status)
    e = fetch("/away", { follow = 1, allow_once = 1 }).err
    assert.truthy(e and e:find("^address refused: [%x:.]+ %(allow said no%)$"), tostring(e))
    -- a bad list is the caller's error
    assert.truthy(fetch("/hello", { deny = "nowhere" }).err:find("not a name, an address or a CIDR", 1, true))
  end)

  -- RFC 9112 2.2: a recipient may take a bare LF for a line's end (and
  -- ignore a CR before it); some servers send them. The head used to be
  -- looked for as "\r\n\r\n" only: such an answer waited for the timeout.
  it("a response head with bare LF line ends (and a chunked body so) is read", function()
    local r = fetch("/lf", { timeout = 5000 })
    assert.same({ 200, "bare lf", "text/plain", "crlf" },
                { r.status, r.body, r.headers and r.headers["content-type"], r.headers and r.headers["x-mixed"] },
                cjson.encode(r))
    r = fetch("/lfchunked", { timeout = 5000 })
    assert.same({ 200, "abcde" }, { r.status, r.body }, cjson.encode(r))
    -- still bounded by max_header, however the lines end
    assert.equal("response header too large", fetch("/lfbig", { timeout = 5000 }).err)
    r = fetch("/lf", { max_header = 40, timeout = 5000 })
    assert.equal("response header too large", r.err)
  end)

  it("a redirect loop ends with too many redirects", function()
    assert.equal("too many redirects", fetch("/loop", { follow = 4 }).err)
  end)

  it("bad upstreams are a clear nil, err and the lane keeps serving", function()
    local t0 = H.now()
    assert.equal("timeout", fetch("/slow?ms=3000", { timeout = 200 }).err)
    assert.truthy(H.now() - t0 < H.T(2))
    assert.equal("response header too large", fetch("/bighdr").err)
    assert.equal("response header too large", fetch("/hello", { max_header = 64 }).err)
    assert.equal("closed before the end of the body", fetch("/lying").err)
    assert.equal("body too large", fetch("/forever", { max_body = 200000 }).err)
    assert.equal("body too large", fetch("/hello", { max_body = 5 }).err)
    assert.truthy(fetch("/reset").err)
    assert.equal("connection refused", fetch("http://127.0.0.1:" .. H.free_port() .. "/").err)
    -- https:// goes through a TLS connect (tls_client_spec has the rest)
    assert.equal("connection refused", fetch("https://127.0.0.1:" .. H.free_port() .. "/").err)
    assert.equal(200, fetch("/hello").status)
  end)

  it("stream = true: res:read() gives the pieces, the connection pooled at the end", function()
    local n0 = conns()
    local r = fetch("/chunked", { stream = 1 })
    assert.same({ 200, "abc" }, { r.status, r.body })
    assert.truthy(r.pieces >= 2, "pieces: " .. r.pieces) -- "a", "b", "c" 20 ms apart
    r = fetch("/hello", { stream = 1 })
    assert.same({ 200, "hello from node" }, { r.status, r.body })
    assert.equal(n0, conns())
    r = fetch("/s204", { stream = 1 })
    assert.same({ 204, "", 0 }, { r.status, r.body, r.pieces })
    r = fetch("/forever", { stream = 1, max_body = 100000 })
    assert.equal("body too large", r.err)
    assert.truthy(r.pieces >= 1)
    assert.equal("closed before the end of the body", fetch("/lying", { stream = 1 }).err)
    -- /forever's connection (the pooled one) was closed on the error,
    -- /lying's by the server: /conns comes on a third one
    assert.equal(n0 + 2, conns())
  end)

  it("Python's http.server: a file and a 404", function()
    local r = fetch("http://127.0.0.1:" .. pyport .. "/file.txt")
    assert.same({ 200, "a file served by python\n" }, { r.status, r.body })
    r = fetch("http://127.0.0.1:" .. pyport .. "/missing")
    assert.equal(404, r.status)
  end)

  it("an IPv6 literal URL", function()
    -- The Node upstream listens on 127.0.0.1 only: [::1] is refused, but the
    -- URL parses and the connect goes to ::1.
    local r = fetch("http://[::1]:" .. H.free_port() .. "/")
    assert.equal("connection refused", r.err)
  end)

  it("three fetches in mp.spawn take the time of the slowest", function()
    local r = get(port, "/three?base=" .. esc(base))
    assert.same({ "slow", "slow", "slow" }, r.bodies)
    assert.truthy(r.ms >= 290 and r.ms < 550, "took " .. r.ms .. " ms")
  end)
end)
