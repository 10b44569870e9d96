-- Spec: static files, mp.http { public = "dir" }, end to end against the
-- real binary. curl drives the ordinary paths (Range, conditionals,
-- --compressed, --path-as-is); raw sockets send what curl would clean up
-- (%2e%2e, backslashes, NUL) and check keep-alive and pipelining.
-- The application is spec/fixtures/static_app.lua; each test serves a
-- fresh copy of spec/fixtures/public in a temp dir, next to a secret file
-- the server must never show, with symlinks made here.
local H = require "spec.helper"
local lfs = require "lfs"

local CURL = "/usr/bin/curl"
local SECRET = "TOP SECRET: outside the public folder\n"

---------------------------------------------------------------------------
-- The served tree
---------------------------------------------------------------------------

local function write_file(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

local function sh(cmd)
  local ok = os.execute(cmd)
  assert(ok == true or ok == 0, "failed: " .. cmd)
end

-- Bytes 0..255 in a non-periodic order, n of them.
local function binary(n)
  local parts, chunk, x = {}, {}, 12345
  for _ = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    chunk[#chunk + 1] = string.char(math.floor(x / 65536) % 256)
    if #chunk == 4096 then parts[#parts + 1] = table.concat(chunk); chunk = {} end
  end
  parts[#parts + 1] = table.concat(chunk)
  return table.concat(parts)
end

local BIG = binary(300000)

-- A temp dir holding secret.txt and pub/ (the fixture folder plus big.bin
-- and symlinks). Returns the dir and the public folder's path.
local function tree()
  local dir = H.tmpdir()
  local pub = dir .. "/pub"
  sh(("cp -a '%s/public' '%s'"):format(H.fixtures, pub))
  write_file(dir .. "/secret.txt", SECRET)
  lfs.mkdir(dir .. "/outside")
  write_file(dir .. "/outside/index.html", SECRET)
  write_file(pub .. "/big.bin", BIG)
  assert(lfs.link("../secret.txt", pub .. "/escape.txt", true))
  assert(lfs.link(dir .. "/secret.txt", pub .. "/escape_abs.txt", true))
  assert(lfs.link("../outside", pub .. "/outdir", true))
  assert(lfs.link("sub/page.txt", pub .. "/inside.txt", true))
  assert(lfs.link("../notes.txt", pub .. "/sub/up.txt", true))
  return dir, pub
end

local function read(path) return assert(H.read_file(path)) end

---------------------------------------------------------------------------
-- Servers and clients
---------------------------------------------------------------------------

-- Starts static_app.lua on a fresh port serving `pub` (with on_request
-- unless noapp).
local function start(pub, noapp, prefix)
  local port = H.free_port()
  local srv = H.start("static_app.lua", {
    args = { port, pub, noapp and "noapp" or "app", prefix }, wait_port = port })
  return srv, port
end

--- Runs curl with `args` (after -sS --noproxy '*' -i --max-time). Returns
--- the last response parsed ({ status, headers, body, raw }) and curl's
--- whole output.
local function curl(args)
  local argv = { CURL, "-sS", "--noproxy", "*", "-i", "--max-time", tostring(H.T(10)) }
  for _, a in ipairs(args) do argv[#argv + 1] = tostring(a) end
  local p = H.spawn(argv)
  local st = p:wait_exit(H.T(20))
  if not st then p:kill(H.SIGKILL); p:wait_exit(5); error("curl did not finish") end
  p.sanitizer_checked = true
  local out = p:stdout()
  assert.equal(0, st, "curl " .. table.concat(args, " ") .. ": " .. p:stderr())
  -- the last head in the output (curl -i prints each), then the body
  local at, last = 1, nil
  while true do
    local s = out:find("HTTP/1%.%d %d%d%d", at)
    if not s then break end
    last = s
    local e = out:find("\r\n\r\n", s, true)
    if not e then break end
    at = e + 4
  end
  assert.truthy(last, "no response in curl output: " .. out:sub(1, 300))
  local head_end = out:find("\r\n\r\n", last, true)
  local head = out:sub(last, head_end - 1)
  local r = { headers = {}, body = out:sub(head_end + 4), raw = out }
  r.status = tonumber(head:match("^HTTP/1%.%d (%d%d%d)"))
  for k, v in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
    local lk = k:lower()
    r.headers[lk] = r.headers[lk] and (r.headers[lk] .. ", " .. v) or v
  end
  return r
end

local function url(port, path) return ("http://127.0.0.1:%d%s"):format(port, path) end

local function get(target, extra, method, version)
  return ("%s %s HTTP/%s\r\nHost: test\r\n%s\r\n"):format(method or "GET", target,
    version or "1.1", extra or "")
end

-- Reads one response from a raw connection: { status, headers, body }.
-- HEAD and 304 responses have no body whatever their Content-Length says.
local function response(c, buf, no_body)
  local deadline = H.now() + H.T(5)
  while not buf.s:find("\r\n\r\n", 1, true) do
    local d, err = H.read_some(c, deadline - H.now())
    assert.truthy(d, "head: " .. tostring(err) .. " after " .. ("%q"):format(buf.s))
    buf.s = buf.s .. d
  end
  local e = buf.s:find("\r\n\r\n", 1, true)
  local head = buf.s:sub(1, e - 1)
  buf.s = buf.s:sub(e + 4)
  local r = { headers = {}, status_line = head:match("^[^\r\n]*") }
  r.status = tonumber(head:match("^HTTP/1%.1 (%d%d%d)"))
  for k, v in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do r.headers[k:lower()] = v end
  local n = tonumber(r.headers["content-length"] or "0")
  if no_body or r.status == 304 then n = 0 end
  while #buf.s < n do
    local d, err = H.read_some(c, deadline - H.now())
    assert.truthy(d, "body: " .. tostring(err))
    buf.s = buf.s .. d
  end
  r.body = buf.s:sub(1, n)
  buf.s = buf.s:sub(n + 1)
  return r
end

-- Sends one raw request on a new connection; returns its response.
local function raw(port, request, no_body)
  local c = H.connect(port)
  assert.is_true(H.send(c, request))
  return response(c, { s = "" }, no_body), c
end

local function date_ok(v)
  return v ~= nil and v:match("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$") ~= nil
end

local function last_modified(path)
  return os.date("!%a, %d %b %Y %H:%M:%S GMT", lfs.attributes(path, "modification"))
end

-- The body never shows the secret, whatever the status.
local function no_secret(r)
  assert.is_nil(r.body:find("TOP SECRET", 1, true), "the secret leaked: " .. r.body)
end

---------------------------------------------------------------------------

describe("static files (mp.http public)", function()
  after_each(H.cleanup)

  describe("files", function()
    it("serves a file from C: body, Content-Length, type, ETag, Last-Modified, Accept-Ranges, Date; no Cache-Control", function()
      local _, pub = tree()
      local srv, port = start(pub)
      local r = curl { url(port, "/notes.txt") }
      assert.equal(200, r.status)
      assert.equal(read(pub .. "/notes.txt"), r.body)
      assert.equal(tostring(#r.body), r.headers["content-length"])
      assert.equal("text/plain; charset=utf-8", r.headers["content-type"])
      assert.equal("bytes", r.headers["accept-ranges"])
      assert.equal(last_modified(pub .. "/notes.txt"), r.headers["last-modified"])
      assert.is_true(date_ok(r.headers.date), tostring(r.headers.date))
      assert.is_nil(r.headers["cache-control"])
      assert.is_nil(r.headers["x-app"])                  -- not through Lua
      assert.is_nil(r.headers["vary"])                   -- no .gz sibling
      -- ETag: "<hex size>-<hex mtime in ns>", strong
      local size_hex, ns_hex = r.headers.etag:match('^"(%x+)%-(%x+)"$')
      assert.equal(#r.body, tonumber(size_hex, 16), r.headers.etag)
      local mtime = lfs.attributes(pub .. "/notes.txt", "modification")
      assert.equal(mtime, math.floor(tonumber(ns_hex, 16) / 1e9), r.headers.etag)
      -- a binary through sendfile, byte for byte
      r = curl { url(port, "/big.bin") }
      assert.equal(200, r.status)
      assert.equal(#BIG, #r.body)
      assert.is_true(r.body == BIG, "big.bin differs")
      assert.equal("application/octet-stream", r.headers["content-type"])
      assert.equal(0, srv:stop())
    end)

    it("chooses Content-Type from the extension", function()
      local _, pub = tree()
      local _, port = start(pub)
      local want = {
        ["/index.html"] = "text/html; charset=utf-8",
        ["/style.css"] = "text/css; charset=utf-8",
        ["/app.js"] = "text/javascript; charset=utf-8",
        ["/app.mjs"] = "text/javascript; charset=utf-8",
        ["/data.json"] = "application/json; charset=utf-8",
        ["/logo.svg"] = "image/svg+xml",
        ["/pixel.png"] = "image/png",
        ["/compressed.txt.gz"] = "application/gzip",
        ["/LICENSE.unknownext"] = "application/octet-stream",
      }
      for path, type in pairs(want) do
        local r = curl { url(port, path) }
        assert.equal(200, r.status, path)
        assert.equal(type, r.headers["content-type"], path)
        assert.equal(read(pub .. path), r.body, path)
      end
    end)

    it("HEAD: the GET's headers and length, no body; the connection goes on", function()
      local _, pub = tree()
      local _, port = start(pub)
      local c = H.connect(port)
      local buf = { s = "" }
      assert.is_true(H.send(c, get("/big.bin", nil, "HEAD") .. get("/style.css", nil, "HEAD")
        .. get("/notes.txt")))
      local r = response(c, buf, true)
      assert.equal(200, r.status)
      assert.equal(tostring(#BIG), r.headers["content-length"])
      assert.equal("application/octet-stream", r.headers["content-type"])
      assert.truthy(r.headers.etag)
      r = response(c, buf, true)
      assert.equal(tostring(#read(pub .. "/style.css")), r.headers["content-length"])
      r = response(c, buf)                              -- no body bytes came before it
      assert.equal(200, r.status)
      assert.equal(read(pub .. "/notes.txt"), r.body)
      assert.is_true(H.silent_for(c, 0.2))
    end)

    it("keep-alive and pipelining go on across files, sendfile and Lua, in order", function()
      local _, pub = tree()
      local _, port = start(pub)
      local c = H.connect(port)
      local buf = { s = "" }
      local reqs = get("/big.bin") .. get("/missing?x=1") .. get("/notes.txt")
        .. get("/big.bin", "Range: bytes=1000-1999\r\n") .. get("/sub/")
      assert.is_true(H.send(c, reqs))
      local r = response(c, buf)
      assert.is_true(r.body == BIG, "big.bin")
      r = response(c, buf)
      assert.equal("app GET /missing?x=1", r.body)
      assert.equal("1", r.headers["x-app"])
      assert.equal(read(pub .. "/notes.txt"), response(c, buf).body)
      r = response(c, buf)
      assert.equal(206, r.status)
      assert.is_true(r.body == BIG:sub(1001, 2000), "range")
      assert.equal(read(pub .. "/sub/index.html"), response(c, buf).body)
      -- HTTP/1.0 and Connection: close end the connection after the file
      local r10, c10 = raw(port, get("/notes.txt", nil, nil, "1.0"))
      assert.equal(200, r10.status)
      assert.equal("close", r10.headers.connection)
      assert.equal(nil, (H.read_some(c10, H.T(2))))
      local rc, cc = raw(port, get("/big.bin", "Connection: close\r\n"))
      assert.is_true(rc.body == BIG)
      assert.equal(nil, (H.read_some(cc, H.T(2))))
    end)
  end)

  describe("what is not a file", function()
    it("goes to on_request: a missing path, another method on a file, a hidden file", function()
      local _, pub = tree()
      local _, port = start(pub)
      local r = curl { url(port, "/nothing/here?q=1") }
      assert.same({ 200, "app GET /nothing/here?q=1" }, { r.status, r.body })
      r = curl { "-X", "POST", "--data-binary", "x", url(port, "/notes.txt") }
      assert.same({ 200, "app POST /notes.txt?" }, { r.status, r.body })
      r = curl { "-X", "DELETE", url(port, "/index.html") }
      assert.same({ 200, "app DELETE /index.html?" }, { r.status, r.body })
      r = curl { url(port, "/.env") }
      assert.same({ 200, "app GET /.env?" }, { r.status, r.body })
      r = curl { url(port, "/noindex/") }                -- a folder without index.html
      assert.same({ 200, "app GET /noindex/?" }, { r.status, r.body })
      r = curl { url(port, "/notes.txt/") }              -- a file is not a folder
      assert.same({ 200, "app GET /notes.txt/?" }, { r.status, r.body })
    end)

    it("public_prefix: only paths under it are looked up; the rest go to on_request", function()
      local _, pub = tree()
      local _, port = start(pub, false, "/sub/")
      local r = curl { url(port, "/sub/page.txt") }
      assert.equal(200, r.status)
      assert.equal(read(pub .. "/sub/page.txt"), r.body)
      assert.is_nil(r.headers["x-app"])
      r = curl { url(port, "/notes.txt") }               -- a file, but outside the prefix
      assert.same({ 200, "app GET /notes.txt?", "1" }, { r.status, r.body, r.headers["x-app"] })
      r = curl { url(port, "/") }
      assert.same({ 200, "app GET /?" }, { r.status, r.body })
      -- a bad prefix is refused at startup
      local st, _, err = H.run { H.fixture("static_app.lua"), H.free_port(), pub, "app", "static" }
      assert.equal(1, st)
      assert.truthy(H.one_line(err):find("public_prefix must be a path that starts with /", 1, true), err)
    end)

    it("without on_request: 404 for nothing, 405 with Allow for another method on a file", function()
      local _, pub = tree()
      local _, port = start(pub, true)
      local r = curl { url(port, "/nothing") }
      assert.same({ 404, "Not Found\n" }, { r.status, r.body })
      assert.is_true(date_ok(r.headers.date))
      r = curl { url(port, "/.env") }
      assert.equal(404, r.status)
      r = curl { "-X", "POST", "--data-binary", "x", url(port, "/notes.txt") }
      assert.same({ 405, "GET, HEAD" }, { r.status, r.headers.allow })
      r = curl { "-X", "PUT", "--data-binary", "x", url(port, "/missing") }
      assert.equal(404, r.status)
      -- still keep-alive after a 404
      local c = H.connect(port)
      local buf = { s = "" }
      assert.is_true(H.send(c, get("/nothing") .. get("/notes.txt")))
      assert.equal(404, response(c, buf).status)
      assert.equal(200, response(c, buf).status)
    end)
  end)

  describe("folders", function()
    it("serves index.html for / and dir/, redirects dir to dir/ keeping the query", function()
      local _, pub = tree()
      local _, port = start(pub)
      local r = curl { url(port, "/") }
      assert.equal(200, r.status)
      assert.equal(read(pub .. "/index.html"), r.body)
      assert.equal("text/html; charset=utf-8", r.headers["content-type"])
      r = curl { url(port, "/sub/") }
      assert.equal(read(pub .. "/sub/index.html"), r.body)
      r = curl { url(port, "/sub") }
      assert.same({ 301, "/sub/" }, { r.status, r.headers.location })
      r = curl { url(port, "/sub?a=1&b=%20") }
      assert.same({ 301, "/sub/?a=1&b=%20" }, { r.status, r.headers.location })
      r = curl { "-L", url(port, "/sub?a=1") }
      assert.same({ 200, read(pub .. "/sub/index.html") }, { r.status, r.body })
      -- "//host" would send the browser to another site: one slash only
      r = raw(port, get("//sub"))
      assert.same({ 301, "/sub/" }, { r.status, r.headers.location })
      r = curl { url(port, "/noindex") }                 -- folders redirect even without an index
      assert.same({ 301, "/noindex/" }, { r.status, r.headers.location })
    end)
  end)

  describe("conditional requests", function()
    it("If-None-Match (exact, weak, in a list, *) answers 304 with the validators and no body", function()
      local _, pub = tree()
      local _, port = start(pub)
      local r = curl { url(port, "/style.css") }
      local etag, lm = r.headers.etag, r.headers["last-modified"]
      for _, inm in ipairs { etag, "W/" .. etag, '"nope", ' .. etag, "*" } do
        local c = raw(port, get("/style.css", "If-None-Match: " .. inm .. "\r\n"))
        assert.equal(304, c.status, inm)
        assert.equal(etag, c.headers.etag)
        assert.equal(lm, c.headers["last-modified"])
        assert.is_nil(c.headers["content-length"])
        assert.is_true(date_ok(c.headers.date))
      end
      -- nothing after the 304's head: the next response follows at once
      local c = H.connect(port)
      local buf = { s = "" }
      assert.is_true(H.send(c, get("/style.css", "If-None-Match: " .. etag .. "\r\n") .. get("/notes.txt")))
      assert.equal(304, response(c, buf).status)
      assert.equal(read(pub .. "/notes.txt"), response(c, buf).body)
      -- another tag: the file
      r = curl { "-H", 'If-None-Match: "other"', url(port, "/style.css") }
      assert.same({ 200, read(pub .. "/style.css") }, { r.status, r.body })
      -- and through curl
      r = curl { "-H", "If-None-Match: " .. etag, url(port, "/style.css") }
      assert.equal(304, r.status)
    end)

    it("If-Modified-Since: 304 unless modified since; ignored when If-None-Match is there", function()
      local _, pub = tree()
      local _, port = start(pub)
      local lm = curl { url(port, "/notes.txt") }.headers["last-modified"]
      local r = raw(port, get("/notes.txt", "If-Modified-Since: " .. lm .. "\r\n"))
      assert.equal(304, r.status)
      assert.equal(lm, r.headers["last-modified"])
      r = raw(port, get("/notes.txt", "If-Modified-Since: Fri, 01 Jan 2100 00:00:00 GMT\r\n"))
      assert.equal(304, r.status)
      r = raw(port, get("/notes.txt", "If-Modified-Since: Sat, 01 Jan 2000 00:00:00 GMT\r\n"))
      assert.equal(200, r.status)
      r = raw(port, get("/notes.txt", "If-Modified-Since: not a date\r\n"))
      assert.equal(200, r.status)
      r = raw(port, get("/notes.txt", "If-Modified-Since: " .. lm .. "\r\nIf-None-Match: \"x\"\r\n"))
      assert.equal(200, r.status)
      -- curl -z sends If-Modified-Since
      r = curl { "-z", lm, url(port, "/notes.txt") }
      assert.equal(304, r.status)
    end)

    it("a changed file gets a new ETag, so the old one no longer matches", function()
      local _, pub = tree()
      local _, port = start(pub)
      local old = curl { url(port, "/notes.txt") }.headers.etag
      write_file(pub .. "/notes.txt", "changed!\n")
      local now = os.time() + 5
      lfs.touch(pub .. "/notes.txt", now, now)
      local r = raw(port, get("/notes.txt", "If-None-Match: " .. old .. "\r\n"))
      assert.equal(200, r.status)
      assert.equal("changed!\n", r.body)
      assert.are_not.equal(old, r.headers.etag)
      assert.equal(os.date("!%a, %d %b %Y %H:%M:%S GMT", now), r.headers["last-modified"])
    end)
  end)

  describe("ranges", function()
    it("a-b, a-, -n give 206 with Content-Range; small and sendfile paths", function()
      local _, pub = tree()
      local _, port = start(pub)
      local size = #BIG
      local cases = {
        { "0-9", 1, 10 }, { "100-", 101, size }, { "-50", size - 49, size },
        { "1000-250000", 1001, 250001 }, { "0-99999999", 1, size }, { "-999999999", 1, size },
      }
      for _, k in ipairs(cases) do
        local r = curl { "-r", k[1], url(port, "/big.bin") }
        assert.equal(206, r.status, k[1])
        assert.equal(("bytes %d-%d/%d"):format(k[2] - 1, k[3] - 1, size), r.headers["content-range"], k[1])
        assert.equal(tostring(k[3] - k[2] + 1), r.headers["content-length"], k[1])
        assert.is_true(r.body == BIG:sub(k[2], k[3]), "bytes of " .. k[1])
        assert.equal("application/octet-stream", r.headers["content-type"])
      end
    end)

    it("unsatisfiable: 416 with bytes */size; several ranges or a bad one: the whole file; HEAD ignores Range", function()
      local _, pub = tree()
      local _, port = start(pub)
      local size = #BIG
      for _, spec in ipairs { ("%d-"):format(size), ("%d-%d"):format(size + 10, size + 20), "-0" } do
        local r = raw(port, get("/big.bin", "Range: bytes=" .. spec .. "\r\n"))
        assert.equal(416, r.status, spec)
        assert.equal(("bytes */%d"):format(size), r.headers["content-range"], spec)
        assert.equal("Range Not Satisfiable\n", r.body)
      end
      for _, spec in ipairs { "bytes=0-1,5-6", "bytes=5-1", "items=0-1", "bytes=x" } do
        local r = raw(port, get("/big.bin", "Range: " .. spec .. "\r\n"))
        assert.equal(200, r.status, spec)
        assert.is_nil(r.headers["content-range"])
        assert.is_true(r.body == BIG, spec)
      end
      local r = raw(port, get("/big.bin", "Range: bytes=0-9\r\n", "HEAD"), true)
      assert.equal(200, r.status)
      assert.equal(tostring(size), r.headers["content-length"])
    end)

    it("If-Range: the range when the ETag or date matches, else the whole file", function()
      local _, pub = tree()
      local _, port = start(pub)
      local h = curl { url(port, "/big.bin") }.headers
      local function ranged(ir)
        return raw(port, get("/big.bin", "Range: bytes=10-19\r\nIf-Range: " .. ir .. "\r\n"))
      end
      local r = ranged(h.etag)
      assert.equal(206, r.status)
      assert.is_true(r.body == BIG:sub(11, 20))
      r = ranged(h["last-modified"])
      assert.equal(206, r.status)
      r = ranged('"stale"')
      assert.equal(200, r.status)
      assert.is_true(r.body == BIG)
      r = ranged("W/" .. h.etag)                         -- If-Range compares strongly
      assert.equal(200, r.status)
      r = ranged("Sat, 01 Jan 2000 00:00:00 GMT")
      assert.equal(200, r.status)
    end)
  end)

  describe("precompressed", function()
    it("serves file.gz with Content-Encoding when gzip is accepted, Vary on both variants", function()
      local _, pub = tree()
      local _, port = start(pub)
      local plain = read(pub .. "/compressed.txt")
      local gz = read(pub .. "/compressed.txt.gz")
      local r = curl { "--compressed", url(port, "/compressed.txt") }
      assert.equal(200, r.status)
      assert.equal("gzip", r.headers["content-encoding"])
      assert.equal("text/plain; charset=utf-8", r.headers["content-type"])
      assert.equal("Accept-Encoding", r.headers.vary)
      assert.equal(tostring(#gz), r.headers["content-length"])
      assert.equal(plain, r.body)                        -- curl decoded it
      local gz_etag = r.headers.etag
      -- no Accept-Encoding: the original, still with Vary, another ETag
      r = curl { url(port, "/compressed.txt") }
      assert.is_nil(r.headers["content-encoding"])
      assert.equal("Accept-Encoding", r.headers.vary)
      assert.equal(plain, r.body)
      assert.are_not.equal(gz_etag, r.headers.etag)
      -- q values, raw bytes
      for ae, want_gz in pairs { ["gzip"] = true, ["gzip;q=0.5, br"] = true, ["*"] = true,
                                 ["gzip;q=0"] = false, ["gzip;q=0.000, *"] = false,
                                 ["deflate, br"] = false, ["identity"] = false } do
        local x = raw(port, get("/compressed.txt", "Accept-Encoding: " .. ae .. "\r\n"))
        assert.equal(200, x.status, ae)
        assert.equal(want_gz and gz or plain, x.body, ae)
        assert.equal(want_gz and "gzip" or nil, x.headers["content-encoding"], ae)
        assert.equal("Accept-Encoding", x.headers.vary, ae)
      end
      -- a conditional on the gz variant's tag
      r = raw(port, get("/compressed.txt", "Accept-Encoding: gzip\r\nIf-None-Match: " .. gz_etag .. "\r\n"))
      assert.equal(304, r.status)
      assert.equal("Accept-Encoding", r.headers.vary)
      -- a Range gets the original's bytes, even from a gzip client
      r = raw(port, get("/compressed.txt", "Accept-Encoding: gzip\r\nRange: bytes=0-8\r\n"))
      assert.equal(206, r.status)
      assert.is_nil(r.headers["content-encoding"])
      assert.equal(plain:sub(1, 9), r.body)
      -- a file without a .gz: no Vary, no encoding
      r = curl { "--compressed", url(port, "/notes.txt") }
      assert.is_nil(r.headers["content-encoding"])
      assert.is_nil(r.headers.vary)
    end)

    -- The server remembers which files have no sibling (so a request
    -- does not look again); whatever changes in the folder is seen by
    -- the very next request. One connection keeps every request on the
    -- lane that remembered.
    it("siblings made, renamed in, removed and a folder replaced while serving: the next request sees each", function()
      local _, pub = tree()
      local _, port = start(pub)
      local plain = read(pub .. "/notes.txt")
      local c = H.connect(port)
      local buf = { s = "" }
      local function ask(path, ae)
        assert.is_true(H.send(c, get(path, ae and ("Accept-Encoding: " .. ae .. "\r\n") or "")))
        local r = response(c, buf)
        assert.equal(200, r.status, path)
        return r
      end
      local function is_plain(r, vary, what, want)
        assert.equal(want or plain, r.body, what)
        assert.is_nil(r.headers["content-encoding"], what)
        assert.equal(vary and "Accept-Encoding" or nil, r.headers.vary, what)
      end
      for i = 1, 3 do is_plain(ask("/notes.txt", "gzip, br"), false, "no sibling, request " .. i) end
      -- a .br written beside and renamed in (IN_MOVED_TO)
      write_file(pub .. "/.notes.tmp", "BR BYTES")
      assert(os.rename(pub .. "/.notes.tmp", pub .. "/notes.txt.br"))
      local r = ask("/notes.txt", "br")
      assert.equal("br", r.headers["content-encoding"])
      assert.equal("BR BYTES", r.body)
      assert.equal("Accept-Encoding", r.headers.vary)
      is_plain(ask("/notes.txt"), true, "a client that takes none: the original, with Vary")
      is_plain(ask("/notes.txt", "gzip"), true, "a gzip client, no .gz yet")
      -- a .gz made in place (IN_CREATE)
      write_file(pub .. "/notes.txt.gz", "GZ BYTES")
      r = ask("/notes.txt", "gzip")
      assert.equal("gzip", r.headers["content-encoding"])
      assert.equal("GZ BYTES", r.body)
      -- the .br removed: a br client gets the original, with Vary (the .gz is there)
      assert(os.remove(pub .. "/notes.txt.br"))
      is_plain(ask("/notes.txt", "br"), true, "after the .br went")
      assert(os.remove(pub .. "/notes.txt.gz"))
      is_plain(ask("/notes.txt", "gzip, br"), false, "after both went")
      -- a folder replaced by another one that has a sibling
      local page = read(pub .. "/sub/page.txt")
      is_plain(ask("/sub/page.txt", "gzip"), false, "sub/page.txt as it is", page)
      assert(os.rename(pub .. "/sub", pub .. "/sub.old"))
      lfs.mkdir(pub .. "/sub")
      write_file(pub .. "/sub/page.txt", page)
      write_file(pub .. "/sub/page.txt.gz", "NEW GZ")
      r = ask("/sub/page.txt", "gzip")
      assert.equal("gzip", r.headers["content-encoding"])
      assert.equal("NEW GZ", r.body)
      c:close()
    end)
  end)

  describe("no escape from the folder", function()
    local function refused_all(port, noapp)
      -- curl keeps the path as is; raw requests send encodings curl would touch
      local r = curl { "--path-as-is", url(port, "/../secret.txt") }
      no_secret(r)
      assert.equal(404, r.status)
      r = curl { "--path-as-is", url(port, "/sub/../../secret.txt") }
      no_secret(r)
      assert.equal(404, r.status)
      for _, target in ipairs {
        "/%2e%2e/secret.txt", "/%2E%2E/secret.txt", "/.%2e/secret.txt", "/sub/%2e%2e/%2e%2e/secret.txt",
        "/sub/..%2f..%2fsecret.txt", "/..\\secret.txt", "/sub%5c..%5c..%5csecret.txt",
        "http://test/../secret.txt",
      } do
        local x = raw(port, get(target))
        no_secret(x)
        assert.equal(404, x.status, target)
        assert.is_nil(x.headers["x-app"], target)        -- answered before Lua
      end
      -- symlinks that lead outside: nothing there (the app's, or 404)
      for _, target in ipairs { "/escape.txt", "/escape_abs.txt", "/outdir/", "/outdir/index.html" } do
        local x = raw(port, get(target))
        no_secret(x)
        if noapp then
          assert.equal(404, x.status, target)
        else
          assert.equal("app GET " .. target .. "?", x.body, target)
        end
      end
      -- NUL: malformed, 400 and close
      local x, c = raw(port, get("/notes.txt%00.html"))
      assert.equal(400, x.status)
      assert.equal("close", x.headers.connection)
      assert.equal(nil, (H.read_some(c, H.T(2))))
    end

    it("refuses .., %2e%2e, encoded slashes, backslashes, NUL and outward symlinks (with on_request)", function()
      local _, pub = tree()
      local _, port = start(pub)
      refused_all(port, false)
      -- a symlink that stays inside is followed, also through ".."
      local r = curl { url(port, "/inside.txt") }
      assert.same({ 200, read(pub .. "/sub/page.txt") }, { r.status, r.body })
      r = curl { url(port, "/sub/up.txt") }
      assert.same({ 200, read(pub .. "/notes.txt") }, { r.status, r.body })
      -- an encoded slash is not a file path: the app's
      r = raw(port, get("/sub%2Fpage.txt"))
      assert.equal("app GET /sub/page.txt?", r.body)
    end)

    it("refuses the same without on_request", function()
      local _, pub = tree()
      local _, port = start(pub, true)
      refused_all(port, true)
      assert.equal(200, curl { url(port, "/inside.txt") }.status)
    end)
  end)

  describe("errors", function()
    it("a file that can't be read: 403", function()
      local _, pub = tree()
      write_file(pub .. "/locked.txt", "locked\n")
      sh(("chmod 000 '%s/locked.txt'"):format(pub))
      local port = H.free_port()
      local argv = { H.bin, H.fixture("static_app.lua"), tostring(port), pub }
      local f = io.popen("id -u")
      local root = f:read("*l") == "0"
      f:close()
      if root then
        -- root reads anything: drop the capabilities that let it
        table.insert(argv, 1, "--bounding-set=-dac_override,-dac_read_search")
        table.insert(argv, 1, "/usr/bin/setpriv")
      end
      local srv = H.spawn(argv)
      H.wait_for(function()
        assert(srv:alive(), srv:describe())
        return srv:listens_on(port)
      end, H.T(10), "the server")
      local r = curl { url(port, "/locked.txt") }
      assert.same({ 403, "Forbidden\n" }, { r.status, r.body })
      assert.equal(200, curl { url(port, "/notes.txt") }.status)
    end)

    it("a public folder that does not exist, or is a file: one line at startup", function()
      local dir, pub = tree()
      local port = H.free_port()
      local missing = dir .. "/nope"
      local st, _, err = H.run { H.fixture("static_app.lua"), port, missing }
      assert.equal(1, st, err)
      local l = H.one_line(err)
      assert.truthy(l:find(('mp.http: public folder "%s": No such file or directory'):format(missing), 1, true), l)
      st, _, err = H.run { H.fixture("static_app.lua"), port, pub .. "/notes.txt", "noapp" }
      assert.equal(1, st, err)
      l = H.one_line(err)
      assert.truthy(l:find("Not a directory", 1, true), l)
      assert.is_false(H.is_listening(port))
    end)
  end)
end)
