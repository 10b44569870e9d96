-- Spec: mp.http, the HTTP/1.1 server, end to end against the real binary
-- over real sockets. curl drives the ordinary paths; raw sockets drive
-- pipelining, malformed input, limits, slow clients and keep-alive.
-- The application is spec/fixtures/http_app.lua (routes listed there).
local H = require "spec.helper"
local cjson = require "cjson"

local CURL = "/usr/bin/curl"

---------------------------------------------------------------------------
-- Servers
---------------------------------------------------------------------------

-- start(extra, sopts): http_app.lua on a fresh port; `extra` are key=value
-- mp.http options; sopts.threads / sopts.options / sopts.env go to H.start.
-- cleanup() also kills the servers' workers; track(srv) adds a server
-- started otherwise (see H.fixture_servers).
local start, cleanup, track = H.fixture_servers("http_app.lua")

---------------------------------------------------------------------------
-- Parsing responses (from a socket or from a string such as curl -i output)
---------------------------------------------------------------------------

local Reader = {}
Reader.__index = Reader

local function reader(c) return setmetatable({ c = c, buf = "" }, Reader) end
local function string_reader(s) return setmetatable({ buf = s }, Reader) end

function Reader:_more(deadline)
  if not self.c then return nil, "closed" end
  local d, err = H.read_some(self.c, math.max(0, deadline - H.now()))
  if not d then return nil, err end
  self.buf = self.buf .. d
  return true
end

function Reader:take(n, deadline)
  while #self.buf < n do
    local ok, err = self:_more(deadline)
    if not ok then return nil, err end
  end
  local s = self.buf:sub(1, n)
  self.buf = self.buf:sub(n + 1)
  return s
end

function Reader:line(deadline)
  while true do
    local i = self.buf:find("\r\n", 1, true)
    if i then
      local l = self.buf:sub(1, i - 1)
      self.buf = self.buf:sub(i + 2)
      return l
    end
    local ok, err = self:_more(deadline)
    if not ok then return nil, err end
  end
end

--- The next response. opts.head: a HEAD request's (no body). Returns
--- { status, reason, version, headers (lower-case; repeats joined), list
--- (name/value pairs in order), body, chunks (for chunked), closed (for
--- close-delimited) } or nil, error.
function Reader:response(opts)
  opts = opts or {}
  local deadline = H.now() + (opts.timeout or H.T(5))
  local status_line, err = self:line(deadline)
  if not status_line then
    return nil, ("no status line (%s), have %q"):format(tostring(err), self.buf:sub(1, 300))
  end
  local r = { status_line = status_line, headers = {}, list = {}, chunks = {} }
  local version, status, reason = status_line:match("^HTTP/(%d%.%d) (%d%d%d) (.*)$")
  if not status then return nil, ("bad status line %q"):format(status_line) end
  r.version, r.status, r.reason = version, tonumber(status), reason
  while true do
    local l, e = self:line(deadline)
    if not l then return nil, "head cut short: " .. tostring(e) end
    if l == "" then break end
    local k, v = l:match("^([^:%s]+):[ \t]*(.-)[ \t]*$")
    if not k then return nil, ("bad header line %q"):format(l) end
    r.list[#r.list + 1] = { k, v }
    local lk = k:lower()
    r.headers[lk] = r.headers[lk] and (r.headers[lk] .. ", " .. v) or v
  end
  local h = r.headers
  if opts.head or r.status < 200 or r.status == 204 or r.status == 304 then
    r.body = ""
  elseif h["transfer-encoding"] then
    if h["transfer-encoding"]:lower() ~= "chunked" then
      return nil, "transfer-encoding " .. h["transfer-encoding"]
    end
    while true do
      local sl, e = self:line(deadline)
      if not sl then return nil, "chunk size line cut short: " .. tostring(e), r end
      local n = tonumber(sl:match("^(%x+)") or "", 16)
      if not n then return nil, ("bad chunk size line %q"):format(sl), r end
      if n == 0 then
        repeat
          local tl, e2 = self:line(deadline)
          if not tl then return nil, "trailer cut short: " .. tostring(e2), r end
        until tl == ""
        break
      end
      local d, e2 = self:take(n, deadline)
      if not d then return nil, "chunk cut short: " .. tostring(e2), r end
      r.chunks[#r.chunks + 1] = d
      local crlf = self:take(2, deadline)
      if crlf ~= "\r\n" then return nil, "chunk not ended by CRLF", r end
    end
    r.body = table.concat(r.chunks)
  elseif h["content-length"] then
    local n = tonumber(h["content-length"])
    local d, e = self:take(n, deadline)
    if not d then return nil, "body cut short: " .. tostring(e), r end
    r.body = d
  else
    while true do
      local ok, e = self:_more(deadline)
      if not ok then
        if e == "timeout" then return nil, "close-delimited body: no close", r end
        break
      end
    end
    r.body, self.buf, r.closed = self.buf, "", true
  end
  return r
end

--- True once the peer closed with nothing more sent; else false and why.
function Reader:closes(timeout)
  local deadline = H.now() + (timeout or H.T(5))
  while true do
    if #self.buf > 0 then return false, ("unexpected bytes %q"):format(self.buf:sub(1, 200)) end
    local ok, err = self:_more(deadline)
    if not ok then
      if err == "timeout" then return false, "still open" end
      return true
    end
  end
end

-- Reads one response from `rd` and asserts it parsed.
local function response(rd, opts, what)
  local r, err = rd:response(opts)
  assert.truthy(r, (what or "response") .. ": " .. tostring(err))
  return r
end

local function get(target, extra, version)
  return ("GET %s HTTP/%s\r\nHost: test\r\n%s\r\n"):format(target, version or "1.1", extra or "")
end

local function post(target, body, extra)
  return ("POST %s HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n%s\r\n%s"):format(
    target, #body, extra or "", body)
end

local function esc(s)
  return (s:gsub("[^%w%-%._~/]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function date_ok(v)
  if not v or not v:match("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$") then return false end
  local now = os.time()
  for t = now - 5, now + 2 do
    if os.date("!%a, %d %b %Y %H:%M:%S GMT", t) == v then return true end
  end
  return false
end

-- Bytes 0..255 in a non-periodic order, n of them.
local function binary(n, seed)
  local parts, x = {}, seed or 12345
  local chunk = {}
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    chunk[#chunk + 1] = string.char(math.floor(x / 65536) % 256)
    if #chunk == 4096 then parts[#parts + 1] = table.concat(chunk); chunk = {} end
  end
  parts[#parts + 1] = table.concat(chunk)
  local s = table.concat(parts)
  return s
end

local function write_file(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

---------------------------------------------------------------------------
-- curl
---------------------------------------------------------------------------

--- Runs curl with `args` (after -sS --noproxy '*' --max-time). Returns
--- exit status, stdout, stderr, seconds taken.
local function curl(args, timeout)
  local argv = { CURL, "-sS", "--noproxy", "*", "--max-time", tostring(H.T(10)) }
  for _, a in ipairs(args) do argv[#argv + 1] = tostring(a) end
  local t0 = H.now()
  local p = H.spawn(argv)
  local st = p:wait_exit(timeout or H.T(20))
  if not st then
    p:kill(H.SIGKILL)
    p:wait_exit(5)
    error("curl did not finish: " .. table.concat(argv, " "), 2)
  end
  p.sanitizer_checked = true
  return st, p:stdout(), p:stderr(), H.now() - t0
end

-- curl -i: the status, and the responses it printed (1xx included).
local function curl_i(args, timeout)
  local a = { "-i" }
  for _, x in ipairs(args) do a[#a + 1] = x end
  local st, out, err = curl(a, timeout)
  assert.equal(0, st, "curl " .. table.concat(args, " ") .. " failed: " .. err)
  local rd, list = string_reader(out), {}
  while #rd.buf > 0 do
    local r, e = rd:response()
    assert.truthy(r, "curl output: " .. tostring(e) .. "\n" .. out:sub(1, 500))
    list[#list + 1] = r
  end
  return list[#list], list, out
end

---------------------------------------------------------------------------
-- Refusals
---------------------------------------------------------------------------

--- Sends `request` on a new connection and checks the answer is exactly
--- one "HTTP/1.1 <code> <reason>" response with Connection: close, after
--- which the server closes. `prefix_responses` responses (to requests
--- before the bad one) are read first.
local function refused(port, request, code, reason, prefix_responses)
  local c = H.connect(port)
  assert.is_true(H.send(c, request))
  local rd = reader(c)
  for i = 1, prefix_responses or 0 do
    local r = response(rd, nil, "response " .. i .. " before the refusal")
    assert.equal(200, r.status, "response " .. i .. " before the refusal")
  end
  local r, err = rd:response()
  assert.truthy(r, ("expected %d for %q: %s"):format(code, request:sub(1, 120), tostring(err)))
  assert.equal(("HTTP/1.1 %d %s"):format(code, reason), r.status_line, "for " .. ("%q"):format(request:sub(1, 120)))
  assert.equal("close", r.headers.connection, r.status_line)
  assert.is_true(date_ok(r.headers.date), "Date: " .. tostring(r.headers.date))
  assert.equal(reason .. "\n", r.body)
  local closed, why = rd:closes(H.T(3))
  assert.is_true(closed, ("after %d: %s"):format(code, tostring(why)))
  return r
end

local function hello_ok(port)
  local c = H.connect(port)
  assert.is_true(H.send(c, get("/hello")))
  local r = response(reader(c), nil, "/hello")
  assert.equal(200, r.status)
  assert.equal("hello world\n", r.body)
  c:close()
end

---------------------------------------------------------------------------

describe("mp.http", function()
  after_each(cleanup)

  describe("responses (curl)", function()
    it("answers GET: status line, Date, Content-Length, Content-Type, body", function()
      local srv, port = start()
      local r = curl_i { ("http://127.0.0.1:%d/hello"):format(port) }
      assert.equal("HTTP/1.1 200 OK", r.status_line)
      assert.equal("hello world\n", r.body)
      assert.equal("12", r.headers["content-length"])
      assert.equal("text/plain; charset=utf-8", r.headers["content-type"])
      assert.is_true(date_ok(r.headers.date), "Date: " .. tostring(r.headers.date))
      assert.is_nil(r.headers["transfer-encoding"])
      assert.is_nil(r.headers.connection)           -- 1.1 keep-alive is implied
      -- unknown route: the handler's own 404
      r = curl_i { ("http://127.0.0.1:%d/nope"):format(port) }
      assert.equal("HTTP/1.1 404 Not Found", r.status_line)
      assert.equal("no route /nope\n", r.body)
      assert.equal(0, srv:stop())
    end)

    it("hands the handler method, decoded path, raw query and target, version, lower-case headers (repeats joined), body", function()
      local _, port = start()
      local base = ("http://127.0.0.1:%d"):format(port)
      local st, out, err = curl { base .. "/echo/a%20b%2Fc%C3%A9?x=1%202&y=%2F#frag",
        "-H", "X-Rep: one", "-H", "X-Rep: two", "-H", "X-Mixed-CASE:   Value  " }
      assert.equal(0, st, err)
      local e = cjson.decode(out)
      assert.equal("GET", e.method)
      assert.equal("/echo/a b/c\xc3\xa9", e.path)
      assert.equal("x=1%202&y=%2F", e.query)
      assert.equal("/echo/a%20b%2Fc%C3%A9?x=1%202&y=%2F", e.target)
      assert.equal("1.1", e.version)
      assert.equal("one, two", e.headers["x-rep"])
      assert.equal("Value", e.headers["x-mixed-case"])
      assert.equal(("127.0.0.1:%d"):format(port), e.headers.host)
      for k in pairs(e.headers) do assert.equal(k:lower(), k) end
      assert.equal("", e.body)

      st, out, err = curl { "--http1.0", "-X", "PUT", "--data-binary", "put body", base .. "/echo/v" }
      assert.equal(0, st, err)
      e = cjson.decode(out)
      assert.same({ "PUT", "/echo/v", "", "1.0", "put body", 8 },
        { e.method, e.path, e.query, e.version, e.body, e.body_len })

      st, out, err = curl { "-X", "DELETE", base .. "/echo" }
      assert.equal(0, st, err)
      assert.equal("DELETE", cjson.decode(out).method)
    end)

    it("absolute-form targets: path and query from the URL, target raw", function()
      local _, port = start()
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, get("http://example.com:8080/echo/x%41?q=1")
        .. get("http://example.com")))
      local e = cjson.decode(response(rd).body)
      assert.equal("/echo/xA", e.path)
      assert.equal("q=1", e.query)
      assert.equal("http://example.com:8080/echo/x%41?q=1", e.target)
      local r = response(rd)                   -- no path at all: "/" (404 from the app)
      assert.equal(404, r.status)
      assert.equal("no route /\n", r.body)
      -- the target's authority is the host, whatever Host says (RFC 9112
      -- 3.2.2)
      assert.is_true(H.send(c, "GET http://a.example/echo HTTP/1.1\r\nHost: b.example\r\n\r\n"
        .. "GET http://c.example:81/echo HTTP/1.0\r\nHost: d\r\nConnection: keep-alive\r\n\r\n"))
      assert.equal("a.example", cjson.decode(response(rd).body).headers.host)
      assert.equal("c.example:81", cjson.decode(response(rd).body).headers.host)
    end)

    it("refused with 400 (RFC 9112 3.2, RFC 9110 4.2): another scheme, userinfo or an empty host in the target, a Host that is not host[:port]", function()
      local _, port = start()
      for _, req in ipairs {
        "GET ftp://a.example/p HTTP/1.1\r\nHost: a.example\r\n\r\n",
        "GET http://user@a.example/p HTTP/1.1\r\nHost: a.example\r\n\r\n",
        "GET http:///echo HTTP/1.1\r\nHost: a.example\r\n\r\n",
        "GET /echo HTTP/1.1\r\nHost: a:b:c\r\n\r\n",
        "GET /echo HTTP/1.1\r\nHost: a:99999999\r\n\r\n",
        "GET /echo HTTP/1.1\r\nHost: [::1\r\n\r\n",
      } do
        local c = H.connect(port)
        assert.is_true(H.send(c, req))
        local got = H.read_to_eof(c, H.T(5)) or ""
        assert.truthy(got:find("^HTTP/1.1 400 "), req:match("^[^\r]*") .. " / " .. req:match("Host: ([^\r]*)")
          .. ": " .. got:sub(1, 40))
      end
    end)

    it("res:status and res:header chain; res:json; res:redirect; an unanswered request gets an empty response", function()
      local _, port = start()
      local base = ("http://127.0.0.1:%d"):format(port)
      local r = curl_i { base .. "/status?code=201&body=made" }
      assert.equal("HTTP/1.1 201 Created", r.status_line)
      assert.equal("yes", r.headers["x-custom"])
      assert.equal("2", r.headers["x-second"])
      assert.equal("made", r.body)
      assert.equal("4", r.headers["content-length"])

      r = curl_i { base .. "/status?code=418&body=teapot" }   -- a code without a known reason
      assert.equal(418, r.status)
      assert.equal("teapot", r.body)

      r = curl_i { base .. "/chain" }
      assert.equal(201, r.status)
      assert.equal("1", r.headers["x-chain"])
      assert.equal("chained", r.body)

      r = curl_i { base .. "/json?status=202" }
      assert.equal("HTTP/1.1 202 Accepted", r.status_line)
      assert.equal("application/json", r.headers["content-type"])
      local v = cjson.decode(r.body)
      assert.same({ ok = true, n = 42, list = { 1, 2, 3 }, nested = { s = "caf\xc3\xa9" }, method = "GET" }, v)
      assert.equal(tostring(#r.body), r.headers["content-length"])

      r = curl_i { base .. "/redirect?to=/hello" }
      assert.equal("HTTP/1.1 302 Found", r.status_line)
      assert.equal("/hello", r.headers.location)
      r = curl_i { base .. "/redirect?to=http://example.invalid/x&code=301" }
      assert.equal("HTTP/1.1 301 Moved Permanently", r.status_line)
      assert.equal("http://example.invalid/x", r.headers.location)
      local st, out, err = curl { "-L", base .. "/redirect?to=/hello" }
      assert.equal(0, st, err)
      assert.equal("hello world\n", out)

      r = curl_i { base .. "/empty" }
      assert.equal("HTTP/1.1 200 OK", r.status_line)
      assert.equal("0", r.headers["content-length"])
      assert.equal("", r.body)
      r = curl_i { base .. "/empty?code=404" }
      assert.equal("HTTP/1.1 404 Not Found", r.status_line)
      assert.equal("", r.body)
      r = curl_i { base .. "/empty?code=204" }
      assert.equal("HTTP/1.1 204 No Content", r.status_line)
      assert.is_nil(r.headers["content-length"])
    end)

    it("a JSON endpoint decodes with cjson", function()
      local _, port = start()
      local st, out, err = curl { "-X", "POST", ("http://127.0.0.1:%d/json"):format(port) }
      assert.equal(0, st, err)
      local v = cjson.decode(out)
      assert.equal(true, v.ok)
      assert.equal(42, v.n)
      assert.same({ 1, 2, 3 }, v.list)
      assert.equal("caf\xc3\xa9", v.nested.s)
      assert.equal("POST", v.method)
    end)

    it("serves on a Unix socket (path=)", function()
      local path = H.tmpdir() .. "/http.sock"
      local srv = track(H.start("http_app.lua", { args = { path }, wait_path = path }))
      local st, out, err = curl { "--unix-socket", path, "http://localhost/hello" }
      assert.equal(0, st, err)
      assert.equal("hello world\n", out)
      local c = H.connect_unix(path)
      assert.is_true(H.send(c, get("/echo/u") .. get("/hello")))
      local rd = reader(c)
      assert.equal("/echo/u", cjson.decode(response(rd).body).path)
      assert.equal("hello world\n", response(rd).body)
      assert.equal(0, srv:stop())
    end)
  end)

  describe("streaming", function()
    it("res:write streams with chunked encoding (curl --raw shows the chunks); an unfinished stream is finished", function()
      local _, port = start()
      local base = ("http://127.0.0.1:%d"):format(port)
      local st, out, err = curl { "-i", "--raw", base .. "/stream" }
      assert.equal(0, st, err)
      local head, raw = out:match("^(.-\r\n)\r\n(.*)$")
      assert.truthy(head, out)
      assert.truthy(head:find("\r\nTransfer%-Encoding: chunked\r\n"), head)
      assert.falsy(head:lower():find("content%-length"), head)
      assert.equal("6\r\npart1\n\r\n6\r\npart2\n\r\n6\r\npart3\n\r\n0\r\n\r\n", raw)

      -- chunks sent while the handler sleeps arrive as separate chunks; a
      -- handler that returns without res:finish() gets its stream finished,
      -- and the connection goes on
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, get("/stream?ms=50&noend=1") .. get("/hello")))
      local r = response(rd)
      assert.same({ "part1\n", "part2\n", "part3\n" }, r.chunks)
      assert.equal("hello world\n", response(rd).body)
    end)

    it("an HTTP/1.0 client gets a close-delimited stream", function()
      local _, port = start()
      for _, extra in ipairs { "", "Connection: keep-alive\r\n" } do
        local c = H.connect(port)
        assert.is_true(H.send(c, "GET /stream?ms=20 HTTP/1.0\r\n" .. extra .. "\r\n"))
        local data, err = H.read_to_eof(c, H.T(5))
        assert.truthy(data, "1.0 stream not closed: " .. tostring(err))
        local head, body = data:match("^(.-\r\n)\r\n(.*)$")
        assert.truthy(head, data)
        assert.truthy(head:find("^HTTP/1%.1 200 OK\r\n"), head)
        assert.falsy(head:lower():find("transfer%-encoding"), head)
        assert.falsy(head:lower():find("content%-length"), head)
        assert.truthy(head:find("\r\nConnection: close\r\n"), head)
        assert.equal("part1\npart2\npart3\n", body)
      end
      local st, out, err = curl { "--http1.0", ("http://127.0.0.1:%d/stream"):format(port) }
      assert.equal(0, st, err)
      assert.equal("part1\npart2\npart3\n", out)
    end)
  end)

  describe("connections", function()
    it("keep-alive: two requests on one socket; curl reuses its connection", function()
      local _, port = start()
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, get("/hello")))
      local r = response(rd)
      assert.equal("hello world\n", r.body)
      assert.is_nil(r.headers.connection)
      assert.is_true(H.send(c, post("/echo/2", "second")))
      r = response(rd)
      assert.equal("second", cjson.decode(r.body).body)
      assert.is_true(H.silent_for(c, 0.2))          -- still open, nothing extra

      local base = ("http://127.0.0.1:%d"):format(port)
      local st, out, err = curl { "-v", base .. "/hello", base .. "/hello" }
      assert.equal(0, st, err)
      assert.equal("hello world\nhello world\n", out)
      assert.truthy(err:find("Re%-using existing connection"), "curl did not reuse the connection:\n" .. err)
    end)

    it("Connection: close is honoured; HTTP/1.0 closes unless it asks for keep-alive", function()
      local _, port = start()
      -- 1.1 with Connection: close
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, get("/hello", "Connection: close\r\n")))
      local r = response(rd)
      assert.equal("hello world\n", r.body)
      assert.equal("close", r.headers.connection)
      local closed, why = rd:closes(H.T(3))
      assert.is_true(closed, why)

      -- 1.0 without keep-alive
      c = H.connect(port)
      rd = reader(c)
      assert.is_true(H.send(c, "GET /hello HTTP/1.0\r\n\r\n"))
      r = response(rd)
      assert.equal("HTTP/1.1 200 OK", r.status_line)
      assert.equal("close", r.headers.connection)
      closed, why = rd:closes(H.T(3))
      assert.is_true(closed, why)

      -- 1.0 with keep-alive: two requests, then Connection: close
      c = H.connect(port)
      rd = reader(c)
      for i = 1, 2 do
        assert.is_true(H.send(c, "GET /echo/" .. i .. " HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
        r = response(rd)
        assert.equal("keep-alive", r.headers.connection)
        local e = cjson.decode(r.body)
        assert.same({ "/echo/" .. i, "1.0" }, { e.path, e.version })
      end
      assert.is_true(H.silent_for(c, 0.2))
      assert.is_true(H.send(c, "GET /hello HTTP/1.0\r\n\r\n"))
      r = response(rd)
      assert.equal("close", r.headers.connection)
      closed, why = rd:closes(H.T(3))
      assert.is_true(closed, why)
    end)

    it("res:header: 60 headers of 50 bytes (past what a response keeps inline) all arrive, across GC cycles", function()
      local _, port = start()
      local c = H.connect(port)
      local rd = reader(c)
      for _, n in ipairs { 1, 4, 60 } do
        assert.is_true(H.send(c, get(("/headers?n=%d&len=50"):format(n))))
        local r = response(rd, nil, n .. " headers")
        assert.equal("ok", r.body)
        for i = 1, n do
          assert.equal((string.char(96 + i % 26)):rep(50), r.headers["x-h" .. i], "header " .. i .. " of " .. n)
        end
        assert.is_nil(r.headers["x-h" .. (n + 1)])
      end
    end)

    it("pipelining: requests sent in one write are answered in order, even when the first waits", function()
      local _, port = start()
      local c = H.connect(port)
      local rd = reader(c)
      local t0 = H.now()
      assert.is_true(H.send(c, get("/sleep?ms=300") .. get("/hello") .. post("/echo/third", "3rd body")
        .. get("/echo/last", "Connection: close\r\n")))
      local r1 = response(rd, nil, "response 1")
      assert.equal("slept 300", r1.body)
      assert.is_true(H.now() - t0 >= 0.29, "the sleeping handler answered early")
      local r2 = response(rd, nil, "response 2")
      assert.equal("hello world\n", r2.body)
      local e3 = cjson.decode(response(rd, nil, "response 3").body)
      assert.same({ "POST", "/echo/third", "3rd body" }, { e3.method, e3.path, e3.body })
      local r4 = response(rd, nil, "response 4")
      assert.equal("/echo/last", cjson.decode(r4.body).path)
      assert.equal("close", r4.headers.connection)
      local closed, why = rd:closes(H.T(3))
      assert.is_true(closed, why)
    end)

    it("pipelining: three requests in one write, three responses in order (byte-split variant too)", function()
      local _, port = start()
      local three = get("/echo/1") .. get("/echo/2?b") .. post("/echo/3", "x")
      -- one write
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, three))
      for i = 1, 3 do
        assert.equal("/echo/" .. i, cjson.decode(response(rd, nil, "response " .. i).body).path)
      end
      assert.is_true(H.silent_for(c, 0.1))
      -- the same bytes in pieces of 7 (heads cut anywhere)
      c = H.connect(port)
      rd = reader(c)
      for i = 1, #three, 7 do
        assert.is_true(H.send(c, three:sub(i, i + 6)))
        H.sleep(0.002)
      end
      for i = 1, 3 do
        assert.equal("/echo/" .. i, cjson.decode(response(rd, nil, "split response " .. i).body).path)
      end
    end)

    it("keep-alive idle timeout closes a quiet connection without a response", function()
      local _, port = start { "timeout=1", "header_timeout=5" }
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, get("/hello")))
      assert.equal("hello world\n", response(rd).body)
      local t0 = H.now()
      local closed, why = rd:closes(H.T(1) + 2)
      local took = H.now() - t0
      assert.is_true(closed, "idle keep-alive connection: " .. tostring(why))
      assert.is_true(took >= 0.8, ("closed after %.2fs, before the 1 s idle timeout"):format(took))
    end)
  end)

  describe("request bodies", function()
    it("Content-Length and chunked bodies (curl uploads), chunk extensions and trailers skipped", function()
      local _, port = start()
      local base = ("http://127.0.0.1:%d"):format(port)
      local dir = H.tmpdir()
      local data = {}
      for i = 1, 500 do data[i] = ("line of text %d\n"):format(i) end
      data = table.concat(data)
      write_file(dir .. "/up.txt", data)
      -- Content-Length
      local st, out, err = curl { "--data-binary", "@" .. dir .. "/up.txt", base .. "/raw" }
      assert.equal(0, st, err)
      assert.is_true(out == data, "Content-Length upload came back different")
      -- chunked (curl streams the file in chunks)
      st, out, err = curl { "-v", "-H", "Transfer-Encoding: chunked", "--data-binary", "@" .. dir .. "/up.txt", base .. "/echo/c" }
      assert.equal(0, st, err)
      assert.truthy(err:find("> Transfer%-Encoding: chunked"), "curl did not send chunked:\n" .. err)
      local e = cjson.decode(out)
      assert.equal(#data, e.body_len)
      assert.is_true(e.body == data, "chunked upload decoded differently")
      assert.is_nil(e.headers["content-length"])

      -- by hand: extensions, trailers, then a next request on the same socket
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, "POST /echo/t HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
        .. "5;name=value\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t1\r\nX-Other: t2\r\n\r\n"
        .. get("/hello")))
      e = cjson.decode(response(rd).body)
      assert.equal("hello 0123456789", e.body)
      assert.is_nil(e.headers["x-trailer"])
      assert.equal("hello world\n", response(rd).body)
      -- a zero-length chunked body and a Content-Length: 0 body
      assert.is_true(H.send(c, "POST /echo/z HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        .. post("/echo/z2", "")))
      assert.equal("", cjson.decode(response(rd).body).body)
      assert.equal("", cjson.decode(response(rd).body).body)
    end)

    it("a body that arrives after its head and grows the input buffer keeps the request's fields (8 interleaved connections)", function()
      local _, port = start()
      local n = 20000
      for round = 1, 4 do
        local chunked = round > 2            -- rounds 3 and 4: chunked bodies
        local cs = {}
        for i = 1, 8 do
          cs[i] = H.connect(port)
          assert.is_true(H.send(cs[i], ("POST /echo/conn%d?q=%d HTTP/1.1\r\nHost: test\r\nX-Name: value-%d\r\n%s\r\n")
            :format(i, i, i, chunked and "Transfer-Encoding: chunked\r\n" or ("Content-Length: %d\r\n"):format(n))))
        end
        H.sleep(0.05)                      -- every head is parsed, waiting for its body
        for i = 1, 8 do
          local body = tostring(i % 10):rep(n)
          if chunked then body = ("%x\r\n%s\r\n0\r\n\r\n"):format(n, body) end
          assert.is_true(H.send(cs[i], body))
        end
        for i = 1, 8 do
          local r = response(reader(cs[i]), nil, ("round %d connection %d"):format(round, i))
          assert.equal("HTTP/1.1 200 OK", r.status_line,
            ("round %d (%s) connection %d: %s %s"):format(round, chunked and "chunked" or "Content-Length",
              i, r.status_line, r.body))
          local e = cjson.decode(r.body)
          assert.same({ "POST", "/echo/conn" .. i, "q=" .. i, "value-" .. i, n },
            { e.method, e.path, e.query, e.headers["x-name"], e.body_len })
          assert.is_true(e.body == tostring(i % 10):rep(n), "body differs")
          cs[i]:close()
        end
      end
    end)

    it("Expect: 100-continue gets \"HTTP/1.1 100 Continue\" when the body has not arrived", function()
      local _, port = start()
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, "POST /echo/e HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"))
      local interim = response(rd, nil, "interim response")
      assert.equal("HTTP/1.1 100 Continue", interim.status_line)
      assert.same({}, interim.list)
      assert.is_true(H.silent_for(c, 0.1))
      assert.is_true(H.send(c, "abcde"))
      local r = response(rd)
      assert.equal(200, r.status)
      assert.equal("abcde", cjson.decode(r.body).body)
      -- the body comes with the head: no 100
      assert.is_true(H.send(c, "POST /echo/e2 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nxyz"))
      r = response(rd)
      assert.equal(200, r.status, "expected no 100 Continue, got " .. r.status_line)
      assert.equal("xyz", cjson.decode(r.body).body)

      -- curl with Expect: 100-continue (it adds one by itself for big bodies)
      -- waits for the 100 before sending the body (up to 20 s here: it must
      -- come at once)
      local dir = H.tmpdir()
      local data = ("0123456789abcdef"):rep(200)               -- 3200 bytes
      write_file(dir .. "/body", data)
      local st, out, err, took = curl { "-i", "-v", "--expect100-timeout", "20", "-H", "Expect: 100-continue",
        "--data-binary", "@" .. dir .. "/body", ("http://127.0.0.1:%d/raw"):format(port) }
      assert.equal(0, st, err)
      assert.truthy(err:find("> Expect: 100%-continue"), "curl sent no Expect:\n" .. err)
      assert.truthy(out:find("^HTTP/1%.1 100 Continue\r\n\r\nHTTP/1%.1 200 OK\r\n"), out:sub(1, 300))
      assert.is_true(took < H.T(5), ("curl took %.1fs: the 100 Continue did not come"):format(took))
      local body = out:match("\r\n\r\n.-\r\n\r\n(.*)$")
      assert.is_true(body == data, "the body came back different")
    end)

    it("binary bodies of 1.5 MiB with max_body raised (Content-Length and chunked)", function()
      local _, port = start { "max_body=4194304" }
      local base = ("http://127.0.0.1:%d"):format(port)
      local data = binary(1536 * 1024 + 17)
      local dir = H.tmpdir()
      write_file(dir .. "/bin", data)
      for _, extra in ipairs { {}, { "-H", "Transfer-Encoding: chunked" } } do
        local args = { "--data-binary", "@" .. dir .. "/bin", "-H", "Content-Type: application/octet-stream",
          "-o", dir .. "/out", base .. "/raw" }
        for _, x in ipairs(extra) do table.insert(args, 1, x) end
        local st, _, err = curl(args)
        assert.equal(0, st, err)
        local back = H.read_file(dir .. "/out")
        assert.equal(#data, #back, table.concat(extra, " "))
        assert.is_true(back == data, "binary body came back different " .. table.concat(extra, " "))
      end
      -- raw socket: NULs, CR/LF bytes and all, then a pipelined request
      local c = H.connect(port)
      local rd = reader(c)
      local small = "\0\r\n\r\n\0\255" .. binary(70000, 7) .. "\r\n0\r\n\r\n"
      local ok = H.send(c, post("/raw", small) .. get("/hello"), H.T(10))
      assert.is_true(ok)
      local r = response(rd, { timeout = H.T(10) })
      assert.equal("application/octet-stream", r.headers["content-type"])
      assert.is_true(r.body == small, "raw binary body came back different")
      assert.equal("hello world\n", response(rd).body)
    end)
  end)

  describe("HEAD", function()
    it("sends the headers with the body's Content-Length and no body", function()
      local _, port = start()
      local base = ("http://127.0.0.1:%d"):format(port)
      local st, out, err = curl { "-I", base .. "/hello" }
      assert.equal(0, st, err)
      local r = response(string_reader(out), { head = true })
      assert.equal("HTTP/1.1 200 OK", r.status_line)
      assert.equal("12", r.headers["content-length"])
      assert.is_true(date_ok(r.headers.date))
      assert.equal("", out:match("\r\n\r\n(.*)$"))

      -- on a raw socket, the next response starts right after the head
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, "HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\n"
        .. "HEAD /json HTTP/1.1\r\nHost: t\r\n\r\n"
        .. "HEAD /stream HTTP/1.1\r\nHost: t\r\n\r\n"
        .. get("/hello")))
      r = response(rd, { head = true }, "HEAD /hello")
      assert.equal("12", r.headers["content-length"])
      r = response(rd, { head = true }, "HEAD /json")
      assert.equal("application/json", r.headers["content-type"])
      -- the body a GET gets, with "HEAD" for the method it reports
      local json_len = #(curl_i({ base .. "/json" }).body:gsub('"GET"', '"HEAD"'))
      assert.equal(tostring(json_len), r.headers["content-length"])
      r = response(rd, { head = true }, "HEAD /stream")
      assert.equal(200, r.status)
      r = response(rd, nil, "GET after the HEADs")
      assert.equal("HTTP/1.1 200 OK", r.status_line, "body bytes were sent for a HEAD")
      assert.equal("hello world\n", r.body)
      assert.is_true(H.silent_for(c, 0.1))
    end)
  end)

  describe("refusals", function()
    it("malformed requests: 400 and close", function()
      local srv, port = start()
      local cases = {
        { "GARBAGE\r\n\r\n", "no target or version" },
        { "GET /\r\nHost: t\r\n\r\n", "no version" },
        { "GET / HTTP/1.1\r\nHost: t\r\nBad Header: v\r\n\r\n", "space in a field name" },
        { "GET / HTTP/1.1\r\nHost: t\r\nX-A : v\r\n\r\n", "space before the colon" },
        { "GET / HTTP/1.1\r\nHost: t\r\nX-A: v\r\n folded\r\n\r\n", "obsolete folding" },
        { "GET / HTTP/1.1\r\nHost: t\r\nNoColon\r\n\r\n", "a field without a colon" },
        { "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 without Host" },
        { "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "two Host fields" },
        { "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "Content-Length with Transfer-Encoding" },
        { "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n", "Content-Length not a number" },
        { "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", "two different Content-Lengths" },
        { "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n", "negative Content-Length" },
        { "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", "a bad chunk size" },
        { "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", "a chunk not ended by CRLF" },
        { "GET /%zz HTTP/1.1\r\nHost: t\r\n\r\n", "a bad percent escape" },
        { "GET /a%00b HTTP/1.1\r\nHost: t\r\n\r\n", "an encoded NUL in the path" },
      }
      for _, case in ipairs(cases) do
        local ok, err = pcall(refused, port, case[1], 400, "Bad Request")
        assert.is_true(ok, case[2] .. ": " .. tostring(err))
      end
      -- a bad request after a good one on a keep-alive connection
      refused(port, get("/hello") .. "BROKEN\r\n\r\n", 400, "Bad Request", 1)
      hello_ok(port)
      assert.is_true(srv:alive())
    end)

    it("501 for an unknown transfer coding, 505 for HTTP/2.0 and HTTP/1.2", function()
      local _, port = start()
      refused(port, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "Not Implemented")
      refused(port, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "Not Implemented")
      refused(port, "GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505, "HTTP Version Not Supported")
      refused(port, "GET / HTTP/1.2\r\nHost: t\r\n\r\n", 505, "HTTP Version Not Supported")
      refused(port, "GET / HTTP/0.9\r\nHost: t\r\n\r\n", 505, "HTTP Version Not Supported")
      hello_ok(port)
    end)

    it("what nginx refuses and the RFCs say to refuse: a Host that isn't a host (400), a raw byte past ASCII in the target (400), CONNECT (501: no tunnel), a lower-case method (501); extension methods and odd but valid hosts reach the app", function()
      local _, port = start()
      refused(port, "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "Bad Request")
      refused(port, "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, "Bad Request")
      refused(port, "GET /\xff HTTP/1.1\r\nHost: t\r\n\r\n", 400, "Bad Request")
      refused(port, "CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n", 501, "Not Implemented")
      refused(port, "get / HTTP/1.1\r\nHost: t\r\n\r\n", 501, "Not Implemented")
      for _, req in ipairs { "PURGE /echo HTTP/1.1\r\nHost: t\r\n\r\n",
                             "GET /echo HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
                             "GET /echo/caf%C3%A9 HTTP/1.1\r\nHost: t\r\n\r\n" } do
        local c = H.connect(port)
        local rd = reader(c)
        assert.is_true(H.send(c, req))
        local r = response(rd)
        assert.equal(200, r.status, req)
        c:close()
      end
      hello_ok(port)
    end)

    it("431 for a head over max_header or with more than 100 fields; max_header can be raised", function()
      local _, port = start()
      -- under the default 8192: served
      local c = H.connect(port)
      assert.is_true(H.send(c, get("/echo/big", "X-Big: " .. ("b"):rep(7000) .. "\r\n")))
      assert.equal(7000, #cjson.decode(response(reader(c)).body).headers["x-big"])
      -- over it
      refused(port, get("/echo/big", "X-Big: " .. ("b"):rep(9000) .. "\r\n"), 431, "Request Header Fields Too Large")
      -- a head that never ends, over the limit, without its empty line
      refused(port, "GET / HTTP/1.1\r\nHost: t\r\nX-Big: " .. ("c"):rep(9000), 431, "Request Header Fields Too Large")
      -- 100 fields (Host + 99) are fine, 101 are not
      local fields = {}
      for i = 1, 99 do fields[i] = ("X-F%d: %d\r\n"):format(i, i) end
      c = H.connect(port)
      assert.is_true(H.send(c, get("/echo/f", table.concat(fields))))
      local n = 0
      for _ in pairs(cjson.decode(response(reader(c)).body).headers) do n = n + 1 end
      assert.equal(100, n)
      fields[100] = "X-F100: 100\r\n"
      refused(port, get("/echo/f", table.concat(fields)), 431, "Request Header Fields Too Large")

      -- max_header raised
      local _, port2 = start { "max_header=32768" }
      c = H.connect(port2)
      assert.is_true(H.send(c, get("/echo/big", "X-Big: " .. ("b"):rep(20000) .. "\r\n")))
      assert.equal(20000, #cjson.decode(response(reader(c)).body).headers["x-big"])
      refused(port2, get("/echo/big", "X-Big: " .. ("b"):rep(33000) .. "\r\n"), 431, "Request Header Fields Too Large")
    end)

    it("413: Content-Length over max_body before the body is read; a chunked body over max_body", function()
      -- the default max_body is 1 MiB: only the head is sent
      local _, port = start()
      refused(port, "POST /raw HTTP/1.1\r\nHost: t\r\nContent-Length: 1048577\r\n\r\n", 413, "Content Too Large")
      -- curl's big upload waits for 100 Continue and gets the 413 instead
      local dir = H.tmpdir()
      write_file(dir .. "/big", ("z"):rep(1048577))
      local r = curl_i { "--expect100-timeout", "20", "-H", "Expect: 100-continue", "--data-binary", "@" .. dir .. "/big",
        ("http://127.0.0.1:%d/raw"):format(port) }
      assert.equal("HTTP/1.1 413 Content Too Large", r.status_line)

      -- a small max_body: exactly at the limit is fine, one byte over is not
      local _, p2 = start { "max_body=1000" }
      local c = H.connect(p2)
      local rd = reader(c)
      local body = ("k"):rep(1000)
      assert.is_true(H.send(c, post("/raw", body)))
      assert.is_true(response(rd).body == body)
      local chunked = "POST /raw HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      assert.is_true(H.send(c, chunked .. "258\r\n" .. ("a"):rep(600) .. "\r\n190\r\n" .. ("b"):rep(400) .. "\r\n0\r\n\r\n"))
      assert.equal(1000, #response(rd).body)
      refused(p2, post("/raw", body .. "!"), 413, "Content Too Large")
      refused(p2, chunked .. "258\r\n" .. ("a"):rep(600) .. "\r\n191\r\n" .. ("b"):rep(401) .. "\r\n0\r\n\r\n",
        413, "Content Too Large")
      -- the chunked refusal comes before the body ends (no final chunk sent)
      refused(p2, chunked .. "400\r\n" .. ("a"):rep(1024) .. "\r\n", 413, "Content Too Large")
      hello_ok(p2)
    end)
  end)

  describe("slow clients", function()
    it("a client dribbling its head past header_timeout gets 408 and is closed; others are served meanwhile", function()
      local _, port = start { "header_timeout=1" }
      local slow = H.connect(port)
      local srd = reader(slow)
      local t0 = H.now()
      assert.is_true(H.send(slow, "GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: "))
      local served, worst, got408, sent = 0, 0, false, 0
      local other = H.connect(port)
      local ord = reader(other)
      local deadline = t0 + H.T(1) + 3
      while H.now() < deadline do
        -- the slow client: one byte every 200 ms, until the server answers
        if H.wait_fd(slow:getfd(), H.POLLIN, 0) then got408 = true break end
        local ok = H.send(slow, "a", 1)
        if not ok then got408 = true break end
        sent = sent + 1
        -- another client is served meanwhile
        local t1 = H.now()
        assert.is_true(H.send(other, get("/hello")))
        local r = response(ord, { timeout = H.T(1) }, "the other client")
        assert.equal("hello world\n", r.body)
        served = served + 1
        worst = math.max(worst, H.now() - t1)
        H.sleep(0.2)
      end
      assert.is_true(got408, ("the dribbling client was not cut off within %.1fs (%d bytes dribbled, each within header_timeout=1 of the last)")
        :format(H.now() - t0, sent))
      local r, err = srd:response()
      assert.truthy(r, "no 408: " .. tostring(err))
      local took = H.now() - t0
      assert.equal("HTTP/1.1 408 Request Timeout", r.status_line)
      assert.equal("close", r.headers.connection)
      local closed, why = srd:closes(H.T(2))
      assert.is_true(closed, why)
      assert.is_true(took >= 0.9, ("408 after %.2fs, before header_timeout"):format(took))
      assert.is_true(served >= 3, "the other client was served " .. served .. " times")
      assert.is_true(worst < H.T(0.5), ("the other client waited %.2fs"):format(worst))
    end)

    it("a body dribbled past header_timeout gets 408 and is closed", function()
      local _, port = start { "header_timeout=1" }
      local c = H.connect(port)
      local rd = reader(c)
      local t0 = H.now()
      assert.is_true(H.send(c, "POST /raw HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n"))
      local deadline = t0 + H.T(1) + 3
      local cut, sent = false, 0
      while H.now() < deadline do
        if H.wait_fd(c:getfd(), H.POLLIN, 0) then cut = true break end
        if not H.send(c, "b", 1) then cut = true break end
        sent = sent + 1
        H.sleep(0.2)
      end
      assert.is_true(cut, ("a body dribbled for %.1fs (%d of 100 bytes) was not cut off by header_timeout=1")
        :format(H.now() - t0, sent))
      local r, err = rd:response()
      assert.truthy(r, "no 408: " .. tostring(err))
      assert.equal("HTTP/1.1 408 Request Timeout", r.status_line)
      assert.is_true(H.now() - t0 >= 0.9, "408 before header_timeout")
      local closed, why = rd:closes(H.T(2))
      assert.is_true(closed, why)
    end)

    it("header_timeout: a stalled head or body gets 408; a head done within it is served; a silent connection is closed; a slow handler is not cut off", function()
      local _, port = start { "header_timeout=1" }
      -- a partial head, then nothing
      for _, partial in ipairs { "GET /hello HTTP/1.1\r\nHost: t\r\nX-Half",
                                 "POST /raw HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc" } do
        local c = H.connect(port)
        local rd = reader(c)
        local t0 = H.now()
        assert.is_true(H.send(c, partial))
        local r, err = rd:response { timeout = H.T(1) + 2 }
        assert.truthy(r, ("no 408 for a stalled %q: %s"):format(partial, tostring(err)))
        local took = H.now() - t0
        assert.equal("HTTP/1.1 408 Request Timeout", r.status_line)
        assert.equal("close", r.headers.connection)
        assert.equal("Request Timeout\n", r.body)
        assert.is_true(took >= 0.9, ("408 after %.2fs, before header_timeout"):format(took))
        local closed, why = rd:closes(H.T(2))
        assert.is_true(closed, why)
      end

      -- a head in two pieces 300 ms apart, well within the second: served
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, "GET /hello HTTP/1.1\r\n"))
      H.sleep(0.3)
      assert.is_true(H.send(c, "Host: t\r\n\r\n"))
      assert.equal("hello world\n", response(rd).body)

      -- a silent new connection is closed after header_timeout, without a response
      c = H.connect(port)
      rd = reader(c)
      local t0 = H.now()
      local closed, why = rd:closes(H.T(1) + 2)
      assert.is_true(closed, "silent connection: " .. tostring(why))
      assert.is_true(H.now() - t0 >= 0.8)

      -- a handler sleeping 1.5 s (past header_timeout) still answers
      c = H.connect(port)
      rd = reader(c)
      assert.is_true(H.send(c, get("/sleep?ms=1500")))
      local r = response(rd, { timeout = H.T(4) })
      assert.equal("slept 1500", r.body)
    end)
  end)

  describe("handlers", function()
    it("a handler waiting in mp.sleep does not hold up other connections", function()
      local _, port = start()
      local a = H.connect(port)
      local ard = reader(a)
      local t0 = H.now()
      assert.is_true(H.send(a, get("/sleep?ms=1000")))
      H.sleep(0.05)
      local b = H.connect(port)
      assert.is_true(H.send(b, get("/hello")))
      local rb = response(reader(b))
      assert.equal("hello world\n", rb.body)
      -- b was answered while a's handler still sleeps
      assert.is_false(H.wait_fd(a:getfd(), H.POLLIN, 0),
        ("the sleeping handler's connection answered first (after %.2fs)"):format(H.now() - t0))
      assert.is_true(H.now() - t0 < 0.95, "the other connection waited for the sleeping handler")
      local ra = response(ard, { timeout = H.T(3) })
      assert.equal("slept 1000", ra.body)
      assert.is_true(H.now() - t0 >= 0.98, "mp.sleep(1000) returned early")
    end)

    it("a Lua error answers 500 and logs the traceback; the connection stays usable", function()
      local srv, port = start()
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, get("/error")))
      local r = response(rd)
      assert.equal("HTTP/1.1 500 Internal Server Error", r.status_line)
      assert.equal("Internal Server Error\n", r.body)
      -- the 500 keeps the headers the handler set (a request id survives)
      assert.equal("1", r.headers["x-before-error"])
      assert.is_nil(r.headers.connection)
      -- same connection: the next request works
      assert.is_true(H.send(c, get("/hello")))
      assert.equal("hello world\n", response(rd).body)
      -- pipelined after an error too
      assert.is_true(H.send(c, get("/error") .. get("/echo/after")))
      assert.equal(500, response(rd).status)
      assert.equal("/echo/after", cjson.decode(response(rd).body).path)

      local line = H.fixture_line("http_app.lua", 'error("boom from the handler")')
      srv:wait_stderr("moonport: error in on_request: ", H.T(3), true)
      local err = srv:stderr()
      assert.truthy(err:find("moonport: error in on_request: [^\n]*http_app%.lua:" .. line
        .. ": boom from the handler"), err)
      assert.truthy(err:find("stack traceback:", 1, true), "no traceback:\n" .. err)
      assert.is_true(srv:alive())
    end)

    it("a bare coroutine.yield() in on_request answers 500 like an error (it used to leave the client with no answer); a coroutine of the handler's own still yields", function()
      local srv, port = start()
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, get("/yield")))
      local r = response(rd)
      assert.equal(500, r.status)
      assert.equal("Internal Server Error\n", r.body)
      assert.is_true(H.send(c, get("/mywrap")))
      assert.equal("123", response(rd).body)
      srv:wait_stderr("attempt to yield from a callback outside a moonport waiting API", H.T(3), true)
      assert.truthy(srv:stderr():find("error in on_request: [^\n]*http_app%.lua:"
        .. H.fixture_line("http_app.lua", "  coroutine.yield()") .. ": attempt to yield"), srv:stderr())
      assert.is_true(srv:alive())
    end)

    it("a Lua error after a partial stream closes the connection (no final chunk)", function()
      local srv, port = start()
      local c = H.connect(port)
      assert.is_true(H.send(c, get("/stream_error")))
      local data, err = H.read_to_eof(c, H.T(5))
      assert.truthy(data, "connection not closed: " .. tostring(err))
      local head, body = data:match("^(.-\r\n)\r\n(.*)$")
      assert.truthy(head, data)
      assert.truthy(head:find("^HTTP/1%.1 200 OK\r\n"), head)
      assert.truthy(head:find("\r\nTransfer%-Encoding: chunked\r\n"), head)
      assert.equal("8\r\npartial\n\r\n", body, "expected the one chunk and no terminating 0 chunk")
      srv:wait_stderr("boom after streaming", H.T(3), true)
      assert.truthy(srv:stderr():find("moonport: error in on_request: ", 1, true), srv:stderr())
      hello_ok(port)
    end)

    it("res:header raises on CR/LF/NUL, bad names, Content-Length and Transfer-Encoding; nothing is injected", function()
      local _, port = start()
      local r = curl_i { ("http://127.0.0.1:%d/inject"):format(port) }
      assert.equal(200, r.status)
      local results = cjson.decode(r.body)
      local expect = {
        "can't hold CR, LF or NUL", "can't hold CR, LF or NUL", "can't hold CR, LF or NUL",
        "can't hold CR, LF or NUL", "not a valid header name", "not a valid header name",
        "not a valid header name", "not a valid header name", "not a valid header name",
        "sets this header itself", "sets this header itself", "sets this header itself",
        "sets this header itself", "bad URL",
      }
      assert.equal(#expect, #results)
      for i, want in ipairs(expect) do
        assert.is_false(results[i].ok, "case " .. i .. " did not raise")
        assert.truthy(tostring(results[i].err):find(want, 1, true),
          ("case %d: %s"):format(i, tostring(results[i].err)))
      end
      assert.equal("yes", r.headers["x-fine"])
      for _, kv in ipairs(r.list) do
        local k = kv[1]:lower()
        assert.is_true(k ~= "set-cookie" and k ~= "injected" and k ~= "x-evil" and k ~= "location",
          "injected header " .. kv[1] .. ": " .. kv[2])
      end
      assert.equal(1, #(function()
        local t = {}
        for _, kv in ipairs(r.list) do if kv[1]:lower() == "content-length" then t[#t + 1] = kv end end
        return t
      end)())
    end)

    it("res:sendfile sends a file (binary, empty, fixture); a missing one fails; HEAD gets its length", function()
      local _, port = start()
      local base = ("http://127.0.0.1:%d"):format(port)
      local dir = H.tmpdir()
      local data = binary(300000, 99)
      write_file(dir .. "/blob.bin", data)
      write_file(dir .. "/empty", "")
      local st, _, err = curl { "-o", dir .. "/got", base .. "/file?path=" .. esc(dir .. "/blob.bin") }
      assert.equal(0, st, err)
      assert.is_true(H.read_file(dir .. "/got") == data, "sendfile sent other bytes")

      local fixture = H.fixture("http_static.txt")
      local r = curl_i { base .. "/file?path=" .. esc(fixture) }
      assert.equal(200, r.status)
      assert.equal(H.read_file(fixture), r.body)
      assert.equal(tostring(#H.read_file(fixture)), r.headers["content-length"])

      r = curl_i { base .. "/file?path=" .. esc(dir .. "/empty") }
      assert.equal(200, r.status)
      assert.equal("0", r.headers["content-length"])
      assert.equal("", r.body)

      r = curl_i { base .. "/file?path=" .. esc(dir .. "/missing") }
      assert.equal(404, r.status)
      assert.truthy(r.body:find("^sendfile failed: "), r.body)
      r = curl_i { base .. "/file?path=" .. esc(dir) }
      assert.equal(404, r.status)

      local out
      st, out, err = curl { "-I", base .. "/file?path=" .. esc(dir .. "/blob.bin") }
      assert.equal(0, st, err)
      r = response(string_reader(out), { head = true })
      assert.equal("300000", r.headers["content-length"])

      -- keep-alive framing: sendfile, HEAD of it, then another request
      local c = H.connect(port)
      local rd = reader(c)
      local t = "/file?path=" .. esc(dir .. "/blob.bin")
      assert.is_true(H.send(c, get(t) .. "HEAD " .. t .. " HTTP/1.1\r\nHost: t\r\n\r\n" .. get("/hello")))
      r = response(rd, { timeout = H.T(10) })
      assert.is_true(r.body == data, "sendfile on a raw socket sent other bytes")
      r = response(rd, { head = true })
      assert.equal("300000", r.headers["content-length"])
      assert.equal("hello world\n", response(rd).body)
    end)
  end)

  describe("edge cases", function()
    it("204 and 304 responses carry no body: a body the handler gives is not put on the wire", function()
      local _, port = start()
      for _, code in ipairs { 204, 304 } do
        local c = H.connect(port)
        local rd = reader(c)
        assert.is_true(H.send(c, get("/status?code=" .. code .. "&body=oops") .. get("/hello")))
        local r = response(rd, nil, code .. " response")
        assert.is_nil(r.headers["content-length"], code .. " with a Content-Length")
        local r2, err = rd:response()
        assert.truthy(r2, ("the response after a %d with a body is garbled (%s): %s"):format(
          code, tostring(err), tostring(r2 and r2.status_line)))
        assert.equal("HTTP/1.1 200 OK", r2.status_line)
        assert.equal("hello world\n", r2.body)
      end
    end)

    it("a client that leaves while its handler sleeps or streams does not disturb the server", function()
      local srv, port = start()
      for i = 1, 5 do
        local c = H.connect(port)
        assert.is_true(H.send(c, get("/sleep?ms=100") .. get("/hello")))
        c:close()
        c = H.connect(port)
        assert.is_true(H.send(c, get("/stream?ms=60")))
        assert.truthy(H.read_some(c, H.T(2)))
        c:close()
      end
      H.sleep(0.4)                              -- the handlers wake up to closed connections
      hello_ok(port)
      assert.is_true(srv:alive())
      assert.falsy(srv:stderr():find("on_request", 1, true), srv:stderr())
      assert.equal(0, srv:stop())
    end)

    it("SIGTERM: an in-flight handler still answers, idle keep-alive connections close, exit 0", function()
      local srv, port = start()
      local idle = H.connect(port)
      local ird = reader(idle)
      assert.is_true(H.send(idle, get("/hello")))
      assert.equal("hello world\n", response(ird).body)
      local busy = H.connect(port)
      local brd = reader(busy)
      assert.is_true(H.send(busy, get("/sleep?ms=500")))
      H.sleep(0.1)
      local t0 = H.now()
      require("ffi").C.kill(srv:pid(), H.SIGTERM)
      local closed, why = ird:closes(H.T(2))
      assert.is_true(closed, "idle connection at shutdown: " .. tostring(why))
      local r = response(brd, { timeout = H.T(3) })
      assert.equal("slept 500", r.body)
      closed, why = brd:closes(H.T(3))
      assert.is_true(closed, "after the last response at shutdown: " .. tostring(why))
      assert.equal(0, (srv:stop(H.SIGTERM, H.T(5))))
      assert.is_true(H.now() - t0 < H.T(3))
      assert.is_false(H.is_listening(port))
    end)
  end)

  describe("lanes and workers", function()
    -- Opens `n` connections at once and asks each /who. Returns a list of
    -- { pid, lane, worker }.
    local function who(port, n)
      local cs = {}
      for i = 1, n do cs[i] = H.connect(port) end
      for i = 1, n do assert.is_true(H.send(cs[i], get("/who", "Connection: close\r\n"))) end
      local res = {}
      for i = 1, n do
        local r = response(reader(cs[i]), nil, "/who on connection " .. i)
        local pid, lane, w = r.body:match("^(%d+) (%d+) (%d+)$")
        assert.truthy(pid, "bad /who answer: " .. r.body)
        res[i] = { pid = tonumber(pid), lane = tonumber(lane), worker = tonumber(w) }
        cs[i]:close()
      end
      return res
    end

    it("-w 2: responses come from two worker processes over fresh connections", function()
      local srv, port = start(nil, { options = { "-w", "2" } })
      local root = srv:pid()
      local pids, workers, total = {}, {}, 0
      local deadline = H.now() + H.T(15)
      while H.now() < deadline and total < 600 do
        for _, r in ipairs(who(port, 40)) do
          assert.is_true(r.pid ~= root, "the root served a request")
          pids[r.pid] = true
          workers[r.worker] = true
        end
        total = total + 40
        local n = 0
        for _ in pairs(pids) do n = n + 1 end
        if n >= 2 then break end
      end
      local list = {}
      for pid in pairs(pids) do list[#list + 1] = pid end
      assert.equal(2, #list, ("after %d connections, served by pids %s"):format(total, table.concat(list, ",")))
      local kids = {}
      for _, k in ipairs(H.children(root)) do kids[k] = true end
      for _, pid in ipairs(list) do assert.truthy(kids[pid], pid .. " is not a worker of the root") end
      assert.truthy(workers[1] and workers[2], "mp.worker() values seen: " .. cjson.encode(workers))
      -- curl too
      local st, out, err = curl { ("http://127.0.0.1:%d/hello"):format(port) }
      assert.equal(0, st, err)
      assert.equal("hello world\n", out)
      assert.equal(0, srv:stop(H.SIGTERM, H.T(10)))
    end)

    it("3,000 idle keep-alive connections that each made a request cost under 1 KiB each (buffers go back to the lane when idle); they all still work", function()
      local n = 3000
      assert(H.raise_nofile(n + 200) >= n + 100, "needs a higher open-file limit")
      local srv, port = start()
      local conns = {}
      local warm = H.connect(port)
      assert.is_true(H.send(warm, get("/hello")))
      response(reader(warm))
      local base = srv:rss_kb()
      for i = 1, n do
        local c = H.connect(port)
        conns[i] = { c = c, rd = reader(c) }
        assert.is_true(H.send(c, get("/hello")))
        assert.equal("hello world\n", response(conns[i].rd).body)
      end
      H.sleep(0.3)
      local per = (srv:rss_kb() - base) * 1024 / n
      if not H.sanitized then
        assert.is_true(per < 1024, ("%.0f bytes per idle connection"):format(per))
      end
      for i = 1, n, 97 do   -- a sample of them, again
        assert.is_true(H.send(conns[i].c, get("/hello")))
        assert.equal("hello world\n", response(conns[i].rd).body)
      end
      for _, k in ipairs(conns) do k.c:close() end
    end)

    it("a reload under keep-alive clients: the draining worker answers the next request with Connection: close instead of closing an idle connection; every request is answered", function()
      local pidfile = H.tmpdir() .. "/http.pid"
      local srv, port = start(nil, { options = { "-w", "2", "--pidfile", pidfile, "--drain-timeout", "20" } })
      H.wait_for(function() return H.exists(pidfile) end, H.T(5), "the pid file")
      local conns = {}
      for i = 1, 8 do
        local c = H.connect(port)
        conns[i] = { c = c, rd = reader(c) }
        assert.is_true(H.send(c, get("/who")))
        local r = response(conns[i].rd)
        conns[i].pid = tonumber(r.body:match("^(%d+)"))
        assert.is_nil(r.headers.connection)
      end
      local st, out, err = H.run { "--reload", pidfile }
      assert.equal(0, st, out .. err)
      -- the old workers drain (20 s): each keep-alive connection is still
      -- open; its next request is answered, with Connection: close
      for i, k in ipairs(conns) do
        assert.is_true(H.send(k.c, get("/who")))
        local r = response(k.rd, nil, "connection " .. i .. " after the reload")
        assert.equal(k.pid, tonumber(r.body:match("^(%d+)")), "served by its own (old) worker")
        assert.equal("close", r.headers.connection)
        local closed, why = k.rd:closes(H.T(3))
        assert.is_true(closed, "connection " .. i .. ": " .. tostring(why))
      end
      -- fresh connections: the new workers, keep-alive as usual
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, get("/who")))
      local r = response(rd)
      assert.is_nil(r.headers.connection)
      for _, k in ipairs(conns) do assert.is_true(tonumber(r.body:match("^(%d+)")) ~= k.pid) end
      assert.equal(0, srv:stop(H.SIGTERM, H.T(10)))
    end)

    it("-w 2: req.conn_uid is unique across the server (\"SERIAL-ID\", one serial per process) where req.conn_id, a handle within one process, can repeat", function()
      local srv, port = start(nil, { options = { "-w", "2" } })
      local uids, serial_of, pids = {}, {}, {}
      for i = 1, 60 do
        local c = H.connect(port)
        local rd = reader(c)
        assert.is_true(H.send(c, get("/form", "Connection: close\r\n")))
        local f = cjson.decode(response(rd).body)
        c:close()
        local serial, id = f.conn_uid:match("^(%d+)%-(%d+)$")
        assert.truthy(serial, f.conn_uid)
        assert.equal(("%d"):format(f.conn_id), id)
        assert.is_nil(uids[f.conn_uid], "repeated: " .. f.conn_uid)
        uids[f.conn_uid] = true
        serial_of[f.pid] = serial_of[f.pid] or serial
        assert.equal(serial_of[f.pid], serial, "one serial per process")
        pids[f.pid] = true
        if i > 20 and next(pids, next(pids)) then break end
      end
      local serials = {}
      for _, s in pairs(serial_of) do
        assert.is_nil(serials[s], "two processes with serial " .. s)
        serials[s] = true
      end
      assert.equal(0, srv:stop(H.SIGTERM, H.T(10)))
    end)

    it("-t 2: both lanes serve, every connection in order", function()
      local srv, port = start(nil, { threads = 2 })
      local lanes, total = {}, 0
      local deadline = H.now() + H.T(15)
      while H.now() < deadline and total < 600 and not (lanes[1] and lanes[2]) do
        for _, r in ipairs(who(port, 40)) do
          assert.equal(srv:pid(), r.pid)
          lanes[r.lane] = true
        end
        total = total + 40
      end
      assert.truthy(lanes[1] and lanes[2], ("after %d connections, lanes seen: %s"):format(total, cjson.encode(lanes)))
      -- pipelined requests on several connections at once
      local cs = {}
      for i = 1, 20 do
        cs[i] = H.connect(port)
        assert.is_true(H.send(cs[i], get("/echo/" .. i .. "/a") .. post("/echo/" .. i .. "/b", "body" .. i)
          .. get("/sleep?ms=10") .. get("/echo/" .. i .. "/c")))
      end
      for i = 1, 20 do
        local rd = reader(cs[i])
        assert.equal("/echo/" .. i .. "/a", cjson.decode(response(rd).body).path)
        local e = cjson.decode(response(rd).body)
        assert.same({ "/echo/" .. i .. "/b", "body" .. i }, { e.path, e.body })
        assert.equal("slept 10", response(rd).body)
        assert.equal("/echo/" .. i .. "/c", cjson.decode(response(rd).body).path)
      end
      assert.equal(0, srv:stop())
    end)
  end)

  describe("streamed request bodies (stream_body)", function()
    local big = binary(3 * 1024 * 1024, 777)

    it("req:read() hands over a large body in pieces (Content-Length and chunked), req.body is nil, keep-alive goes on", function()
      local _, port = start { "stream_body=1", "max_body=67108864" }
      local dir = H.tmpdir()
      write_file(dir .. "/big.bin", big)
      local base = ("http://127.0.0.1:%d"):format(port)
      for _, chunked in ipairs { false, true } do
        local args = { "-i", "--data-binary", "@" .. dir .. "/big.bin", base .. "/read?every=8&ms=1" }
        if chunked then table.insert(args, 1, "Transfer-Encoding: chunked"); table.insert(args, 1, "-H") end
        local st, out, err = curl(args)
        assert.equal(0, st, err)
        local srd = string_reader(out)
        local r = assert(srd:response())
        if r.status == 100 then r = assert(srd:response()) end -- curl sent Expect
        assert.equal(200, r.status, out:sub(1, 300))
        assert.is_true(r.body == big, "the body came back different (" .. #r.body .. " bytes)")
        assert.is_true(tonumber(r.headers["x-chunks"]) > 1, r.headers["x-chunks"])
        assert.equal("true", r.headers["x-body-nil"])
      end
      -- a body read whole leaves the connection for the next request
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, post("/read", "0123456789") .. get("/hello")
        .. "POST /read HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        .. get("/hello")))
      assert.equal("0123456789", response(rd).body)
      assert.equal("hello world\n", response(rd).body)
      assert.equal("abc", response(rd).body)
      local last = response(rd)
      assert.equal("hello world\n", last.body)
      assert.is_nil(last.headers.connection)
      -- no body: read() gives nil at once
      assert.is_true(H.send(c, get("/read")))
      local r = response(rd)
      assert.equal("", r.body)
      assert.equal("0", r.headers["x-chunks"])
    end)

    it("a handler that doesn't read the body answers with Connection: close; 100-continue goes out only when it reads", function()
      local _, port = start { "stream_body=1" }
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, post("/noread", ("x"):rep(5000)) .. get("/hello")))
      local r = response(rd)
      assert.equal("not read", r.body)
      assert.equal("close", r.headers.connection)
      assert.is_true(rd:closes(H.T(5)), "the connection stays open")
      -- Expect: 100-continue: /read asks for the body, /noread does not
      c = H.connect(port)
      rd = reader(c)
      assert.is_true(H.send(c, "POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"))
      r = response(rd, nil, "interim")
      assert.equal(100, r.status)
      assert.is_true(H.send(c, "hello"))
      assert.equal("hello", response(rd).body)
      c = H.connect(port)
      rd = reader(c)
      assert.is_true(H.send(c, "POST /noread HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"))
      r = response(rd)
      assert.equal(200, r.status)
      assert.equal("not read", r.body)
    end)

    it("limits: a Content-Length over max_body is 413 before on_request; a chunked body that grows past it, a stalled body and a client that leaves end the read with an error", function()
      -- one lane: /read_stats counts what that lane's handlers saw
      local srv, port = start({ "stream_body=1", "max_body=1000", "timeout=1" }, { threads = false })
      local c = H.connect(port)
      local rd = reader(c)
      assert.is_true(H.send(c, "POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n"))
      assert.equal(413, response(rd).status)
      -- chunked past max_body
      c = H.connect(port)
      rd = reader(c)
      assert.is_true(H.send(c, "POST /read HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        .. "200\r\n" .. ("a"):rep(512) .. "\r\n200\r\n" .. ("b"):rep(512) .. "\r\n"))
      local r = response(rd)
      assert.equal(400, r.status)
      assert.equal("error: too large", r.body)
      assert.equal("close", r.headers.connection)
      -- malformed chunked framing
      c = H.connect(port)
      rd = reader(c)
      assert.is_true(H.send(c, "POST /read HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"))
      assert.equal("error: malformed chunked body", response(rd).body)
      -- stalled: 10 of 100 bytes, then nothing for longer than timeout (1 s)
      c = H.connect(port)
      rd = reader(c)
      local t0 = H.now()
      assert.is_true(H.send(c, "POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789"))
      r = response(rd, { timeout = H.T(10) })
      assert.equal("error: timeout", r.body)
      assert.is_true(H.now() - t0 >= 0.9, "timed out after " .. (H.now() - t0) .. " s")
      -- the client leaves halfway: the waiting read gets "closed"
      c = H.connect(port)
      assert.is_true(H.send(c, "POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123"))
      H.sleep(0.2)
      c:close()
      local stats
      H.wait_for(function()
        local st, out = curl { ("http://127.0.0.1:%d/read_stats"):format(port) }
        if st ~= 0 then return false end
        stats = cjson.decode(out)
        return stats.closed == 1
      end, H.T(5), "a read ended by the client leaving")
      assert.equal(1, stats.timeout)
      assert.equal(1, stats["too large"])
      assert.equal(0, srv:stop())
    end)

    it("req:read() without stream_body raises (the body is in req.body)", function()
      local srv, port = start()
      local st, out = curl { "-i", "-d", "abc", ("http://127.0.0.1:%d/read"):format(port) }
      assert.equal(0, st)
      assert.truthy(out:find("^HTTP/1.1 500"), out)
      H.wait_for(function() return srv:stderr():find("stream_body is off", 1, true) end, H.T(5), "the error in the log")
    end)
  end)

  describe("forms, peers and the access log", function()
    it("req.form joins the query and a urlencoded body (decoded, the body's last value wins); req:peer(), req.conn_id", function()
      local _, port = start()
      local url = ("http://127.0.0.1:%d/form?a=1&b=h%%C3%%A9+llo&flag&bad=%%zz"):format(port)
      local st, out, err = curl { url, "-d", "c=3&a=9;d=x%26y" }
      assert.equal(0, st, err)
      local r = cjson.decode(out)
      assert.same({ a = "9", b = "h\xc3\xa9 llo", flag = "", bad = "%zz", c = "3", d = "x&y" }, r.form)
      assert.equal("127.0.0.1", r.ip)
      assert.is_number(r.port)
      assert.is_true(r.port > 0 and r.port ~= port)
      assert.is_number(r.conn_id)
      assert.is_true(r.same)
      assert.is_true(r.ua_any_case)   -- req.headers looks names up in any case
      assert.is_true(r.no_header)
      -- a body of another type is not parsed
      st, out, err = curl { url, "-H", "Content-Type: text/plain", "-d", "c=3" }
      assert.equal(0, st, err)
      r = cjson.decode(out)
      assert.is_nil(r.form.c)
      assert.equal("1", r.form.a)
    end)

    it("--log writes one combined-format line per request, refusals and escapes included", function()
      local dir = H.tmpdir()
      local path = dir .. "/access.log"
      local srv, port = start({}, { options = { "--log", path } })
      local st, _, err = curl { ("http://127.0.0.1:%d/hello?x=1"):format(port), "-A", 'agent "q"',
        "-e", "http://ref/" }
      assert.equal(0, st, err)
      st = curl { ("http://127.0.0.1:%d/nope"):format(port) }
      assert.equal(0, st)
      local c = H.connect(port)
      H.send(c, "BAD\1LINE\r\n\r\n")
      H.read_to_eof(c, H.T(5))
      H.wait_for(function()
        local t = H.read_file(path) or ""
        return select(2, t:gsub("\n", "")) >= 3
      end, H.T(5), "three log lines")
      local lines = H.lines(H.read_file(path))
      assert.equal(3, #lines, table.concat(lines, "\n"))
      assert.truthy(lines[1]:match('^127%.0%.0%.1 %- %- %[%d%d/%a%a%a/%d%d%d%d:%d%d:%d%d:%d%d %+0000%] ' ..
        '"GET /hello%?x=1 HTTP/1%.1" 200 12 "http://ref/" "agent \\x22q\\x22" %d+%.%d%d%d$'), lines[1])
      assert.truthy(lines[2]:find('"GET /nope HTTP/1.1" 404 ', 1, true), lines[2])
      assert.truthy(lines[3]:find('"-" 400 ', 1, true), lines[3])
      assert.equal(0, srv:stop())
      -- a log that can't be opened: one line, exit 1
      local st2, _, err2 = H.run { "--log", dir .. "/no/such/dir/log", H.fixture("http_app.lua"), H.free_port() }
      assert.equal(1, st2)
      assert.truthy(H.one_line(err2):find("cannot open the access log", 1, true), err2)
    end)
  end)

  describe("batched system calls", function()
    -- read(2)/write(2)-family calls of a process, from /proc/PID/io; the
    -- sends and receives the reactor batches through io_uring are not
    -- among them (docs/ARCHITECTURE.md, "Batched system calls").
    local function syscalls(pid)
      local s = H.read_file("/proc/" .. pid .. "/io")
      return tonumber(s:match("syscr:%s*(%d+)")), tonumber(s:match("syscw:%s*(%d+)"))
    end

    -- 20 keep-alive connections, 10 rounds of a request on each at once:
    -- every answer right and in order; returns the read and write calls
    -- the server made for the 200 of them.
    local function rounds(port, pid)
      local conns = {}
      for i = 1, 20 do
        local c = H.connect(port)
        conns[i] = { c = c, rd = reader(c) }
        assert.is_true(H.send(c, get("/echo/warm" .. i)))
        assert.equal("/echo/warm" .. i, cjson.decode(response(conns[i].rd).body).path)
      end
      local r0, w0 = syscalls(pid)
      for round = 1, 10 do
        for i, k in ipairs(conns) do
          assert.is_true(H.send(k.c, get(("/echo/%d/%d"):format(round, i))))
        end
        for i, k in ipairs(conns) do
          local r = response(k.rd, nil, ("round %d, connection %d"):format(round, i))
          assert.equal(("/echo/%d/%d"):format(round, i), cjson.decode(r.body).path)
        end
      end
      local r1, w1 = syscalls(pid)
      for _, k in ipairs(conns) do k.c:close() end
      return r1 - r0, w1 - w0
    end

    it("answers go out through io_uring, a batch of reads and one of writes per loop; with MOONPORT_IO_URING=0 a call each", function()
      local srv, port = start({}, { threads = 1, env = { MOONPORT_IO_URING = false } })
      local reads, writes = rounds(port, srv:pid())
      if srv:stderr():find("io_uring unavailable", 1, true) then
        pending("io_uring is not available on this machine: " .. H.one_line(srv:stderr()))
        return
      end
      -- each write would be a syscw; a few may come from elsewhere (none
      -- expected); reads: a batch whenever one epoll_wait saw several
      assert.is_true(writes < 20, ("%d write calls for 200 answers"):format(writes))
      assert.is_true(reads < 200, ("%d read calls for 200 requests"):format(reads))

      local srv2, port2 = start({}, { threads = 1, env = { MOONPORT_IO_URING = "0" } })
      reads, writes = rounds(port2, srv2:pid())
      assert.is_true(writes >= 200, ("direct: %d write calls for 200 answers"):format(writes))
      assert.is_true(reads >= 200, ("direct: %d read calls for 200 requests"):format(reads))
    end)
  end)

  describe("startup", function()
    it("mp.http without on_request or with a bad option fails at startup with one line", function()
      local port = H.free_port()
      local st, _, err = H.run { H.fixture("http_app.lua"), port, "no_handler=1" }
      assert.equal(1, st, err)
      local l = H.one_line(err)
      assert.truthy(l:find("on_request must be a function", 1, true), l)
      assert.is_false(H.is_listening(port))

      st, _, err = H.run { H.fixture("http_app.lua"), port, "max_header=big" }
      assert.equal(1, st, err)
      l = H.one_line(err)
      assert.truthy(l:find("max_header must be a number", 1, true), l)

      st, _, err = H.run { H.fixture("http_app.lua"), port, "header_timeout=0" }
      assert.equal(1, st, err)
      l = H.one_line(err)
      assert.truthy(l:find("header_timeout out of range", 1, true), l)
    end)
  end)
end)
