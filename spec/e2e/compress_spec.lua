-- Spec: response compression (mp.http { compress = ... }, res:compress),
-- end to end against the real binary with clients we did not write: curl
-- --compressed, and node's http + zlib (spec/node/compress_cases.js),
-- which check the gzip and brotli bytes (CRC, lengths) as they decode.
-- The application is spec/fixtures/compress_app.lua.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local CURL = "/usr/bin/curl"
local start, cleanup = H.fixture_servers("compress_app.lua")

-- A public folder: a CSS file (compressed on the fly), a text file with a
-- .gz sibling (served as it is), and a PNG-named file.
local function public()
  local dir = H.tmpdir()
  H.write_file(dir .. "/style.css", ("body { color: red; } "):rep(400))
  H.write_file(dir .. "/pre.txt", ("original "):rep(300))
  local gz = assert(io.popen("gzip -c > '" .. dir .. "/pre.txt.gz'", "w"))
  gz:write(("from the gz sibling "):rep(100))
  gz:close()
  H.write_file(dir .. "/pic.png", ("not really a png "):rep(300))
  return dir
end

-- node compress_cases.js responses: one row per "path|accept-encoding|method"
local function rows(srv, port, ...)
  local r = JS.run("compress_cases.js", { port, "responses", ... }, 30, srv)
  local out = {}
  for _, row in ipairs(r) do
    if row.path then out[#out + 1] = row end
  end
  return out
end

local function curl(args)
  local argv = { CURL, "-sS", "--noproxy", "*", "--max-time", tostring(H.T(10)) }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local st, out, err = H.exec(argv)
  assert.equal(0, st, "curl: " .. tostring(err))
  return out
end

describe("response compression:", function()
  setup(function()
    local why = JS.missing()
    assert(not why, why)
  end)
  after_each(cleanup)

  it("curl --compressed gets a JSON answer with Content-Encoding, Vary and the right Content-Length, and decodes it", function()
    local srv, port = start({ public() })
    local url = ("http://127.0.0.1:%d/json?n=300"):format(port)
    local head = curl({ "--compressed", "-D", "-", "-o", "/dev/null", url })
    assert.truthy(head:find("\r\nContent%-Encoding: br\r\n"), head)
    assert.truthy(head:find("\r\nVary: Accept%-Encoding\r\n"), head)
    local body = curl({ "--compressed", url })
    assert.equal(300, #cjson.decode(body))
    -- gzip when br is not offered; the length is the compressed body's
    local gz = curl({ "-H", "Accept-Encoding: gzip", "-D", "-", "-o", "/dev/null", url })
    local len = tonumber(gz:match("\r\nContent%-Length: (%d+)\r\n"))
    assert.truthy(gz:find("\r\nContent%-Encoding: gzip\r\n"), gz)
    assert.truthy(len and len < #body / 3, gz)
    assert.truthy(srv:alive())
  end)

  it("node's zlib checks gzip and brotli bytes; q-values, identity;q=0 and br against gzip pick the coding", function()
    local srv, port = start({ public() })
    local r = rows(srv, port, "/json?n=300|gzip", "/json?n=300|br", "/json?n=300|gzip, br",
      "/json?n=300|br;q=0.5, gzip", "/json?n=300|gzip;q=0.2, br;q=0.9",
      "/json?n=300|gzip;q=0", "/json?n=300|*", "/json?n=300|*;q=0",
      "/json?n=300|gzip;q=0.5, identity", "/json?n=300|identity;q=0, *;q=0",
      "/json?n=300|-", "/json?n=300|GZIP;Q=1.000")
    local want = { "gzip", "br", "br", "gzip", "br", cjson.null, "br", cjson.null,
                   cjson.null, cjson.null, cjson.null, "gzip" }
    for i, row in ipairs(r) do
      assert.equal(want[i], row.encoding, row.ae)
      assert.equal(300, row.body_json_len, row.ae)
      assert.equal("Accept-Encoding", row.vary, row.ae)
      assert.equal(200, row.status, row.ae) -- never 406, whatever is refused
      assert.equal(row.raw_len, row.length, row.ae)
      if row.encoding ~= cjson.null then assert.truthy(row.raw_len < row.body_len / 3, row.ae) end
    end
    assert.equal(12, #r)
  end)

  it("leaves alone 204, 304, small bodies, images, res:compress(false); HEAD says what GET would; keeps Vary and makes the ETag weak", function()
    local srv, port = start({ public() })
    -- (text, not JSON: res:json's key order is a lane's, and with -t 4 the
    -- HEAD and the GET may be answered by two lanes)
    local r = rows(srv, port, "/text?size=5000|gzip|HEAD", "/status?s=204|gzip", "/status?s=304|gzip",
      "/text?size=100|gzip", "/image|gzip", "/pic.png|gzip", "/off|gzip", "/etag|gzip",
      "/status?s=404|gzip", "/text?size=5000|-", "/text?size=5000|gzip")
    local head, s204, s304, small, img, png, off, etag, s404, none, get = unpack(r)
    assert.equal("gzip", head.encoding, "HEAD: the encoding a GET gets")
    assert.equal(0, head.raw_len, "HEAD: no body")
    assert.equal(get.raw_len, head.length, "HEAD: the compressed length")
    assert.equal("Accept-Encoding", head.vary)
    assert.equal(204, s204.status)
    assert.equal(cjson.null, s204.encoding)
    assert.equal(304, s304.status)
    assert.equal(cjson.null, s304.encoding)
    assert.equal(cjson.null, small.encoding)
    assert.equal(100, small.length)
    assert.equal("Accept-Encoding", small.vary, "considered: it varies")
    for _, x in ipairs { img, png, off } do
      assert.equal(cjson.null, x.encoding, x.path)
      assert.equal(cjson.null, x.vary, x.path)
    end
    assert.equal("gzip", etag.encoding)
    assert.equal('W/"v1"', etag.etag)
    assert.equal("Origin, Accept-Encoding", etag.vary)
    assert.equal(5000, etag.body_len)
    assert.equal("gzip", s404.encoding, "an error page is compressed too")
    assert.equal(cjson.null, none.encoding, "no Accept-Encoding: identity")
    assert.equal("Accept-Encoding", none.vary)
  end)

  it("static files: a .gz sibling first, else on the fly (Content-Length, weak ETag); a Range gets the original bytes", function()
    local dir = public()
    local srv, port = start({ dir })
    local r = rows(srv, port, "/style.css|gzip", "/style.css|br", "/pre.txt|gzip", "/pre.txt|br")
    local css_gz, css_br, pre_gz, pre_br = unpack(r)
    for _, x in ipairs { css_gz, css_br } do
      assert.equal(8400, x.body_len, x.ae)
      assert.equal(x.raw_len, x.length, x.ae)
      assert.truthy(x.etag:find('^W/"'), x.etag)
    end
    assert.equal("gzip", css_gz.encoding)
    assert.equal("br", css_br.encoding)
    assert.equal("gzip", pre_gz.encoding)
    assert.equal("from the gz sibling ", pre_gz.body_head:sub(1, 20), "the sibling's bytes")
    assert.equal("br", pre_br.encoding)
    assert.equal("original ", pre_br.body_head:sub(1, 9), "no .br sibling: compressed on the fly")
    local url = ("http://127.0.0.1:%d/style.css"):format(port)
    local head = curl({ "-H", "Accept-Encoding: gzip", "-H", "Range: bytes=0-9", "-D", "-", url })
    assert.truthy(head:find("^HTTP/1.1 206"), head)
    assert.falsy(head:find("Content%-Encoding"), head)
    assert.equal("body { col", head:sub(-10))
  end)

  it("HEAD (curl -I) gets the head a GET gets: encoding, Vary, the compressed length, or none for a stream", function()
    local dir = public()
    local srv, port = start({ dir })
    local base = ("http://127.0.0.1:%d"):format(port)
    local function head_of(args)
      local h = curl(args)
      return h, tonumber(h:match("\r\n[Cc]ontent%-[Ll]ength: (%d+)\r\n")),
        h:match("\r\n[Cc]ontent%-[Ee]ncoding: (%w+)\r\n")
    end
    for _, case in ipairs {
      -- (text, not res:json: its key order is a lane's, see above)
      { "/text?size=5000", "gzip" }, { "/text?size=5000", "br" }, { "/style.css", "gzip" },
      { "/style.css", "br" }, { "/file?f=style.css", "gzip" }, { "/file?f=style.css", "br" },
    } do
      local url = base .. case[1]
      for _, h2 in ipairs { false, true } do
        local pre = h2 and { "--http2-prior-knowledge" } or {}
        local function with(t)
          local a = {}
          for _, v in ipairs(pre) do a[#a + 1] = v end
          for _, v in ipairs(t) do a[#a + 1] = v end
          return a
        end
        local what = case[1] .. " " .. case[2] .. (h2 and " h2" or "")
        local gh, glen, genc = head_of(with { "-H", "Accept-Encoding: " .. case[2], "-D", "-", "-o", "/dev/null", url })
        local hh, hlen, henc = head_of(with { "-I", "-H", "Accept-Encoding: " .. case[2], url })
        assert.equal(case[2], genc, what .. ": " .. gh)
        assert.equal(genc, henc, what .. ": " .. hh)
        assert.truthy(glen, what .. ": " .. gh)
        assert.equal(glen, hlen, what .. ": " .. hh)
        assert.truthy(hh:lower():find("\r\nvary: accept%-encoding\r\n"), what .. ": " .. hh)
      end
    end
    -- a stream: no length in either, gzip in both
    local g = curl({ "-H", "Accept-Encoding: gzip", "-D", "-", "-o", "/dev/null", base .. "/pieces?n=50" })
    local h = curl({ "-I", "-H", "Accept-Encoding: gzip", base .. "/pieces?n=50" })
    for _, x in ipairs { g, h } do
      assert.truthy(x:find("\r\nContent%-Encoding: gzip\r\n"), x)
      assert.falsy(x:find("Content%-Length"), x)
    end
    assert.truthy(srv:alive())
  end)

  it("a static file is compressed once and sent again from the cache until it changes", function()
    local dir = public()
    local srv, port = start({ dir }, { threads = 1 }) -- the cache is per thread
    local base = ("http://127.0.0.1:%d"):format(port)
    local function stats() return cjson.decode(curl({ base .. "/stats" })) end
    local function get(coding, out)
      local h = curl({ "-H", "Accept-Encoding: " .. coding, "-D", "-", "-o", out, base .. "/style.css" })
      local dec = coding == "gzip" and { "/usr/bin/gzip", "-dc", out } or { "/usr/bin/node", "-e",
        "process.stdout.write(require('zlib').brotliDecompressSync(require('fs').readFileSync(process.argv[1])))", out }
      local st, body = H.exec(dec)
      assert.equal(0, st, h)
      return h, body
    end
    local t = H.tmpdir()
    local s0 = stats()
    local h1, b1 = get("gzip", t .. "/1")
    local s1 = stats()
    assert.equal(8400, s1.http_compress_in - s0.http_compress_in, "compressed once")
    assert.equal(s0.http_compress_cached, s1.http_compress_cached)
    local h2, b2 = get("gzip", t .. "/2")
    local s2 = stats()
    assert.equal(s1.http_compress_in, s2.http_compress_in, "not compressed again")
    assert.equal(s1.http_compress_cached + 1, s2.http_compress_cached, "sent from the cache")
    assert.equal(b1, b2)
    assert.equal(H.read_file(t .. "/1"), H.read_file(t .. "/2"), "the same bytes")
    assert.equal(h1:match("ETag: ([^\r]+)"), h2:match("ETag: ([^\r]+)"))
    -- revalidated: a 304 with the variant's weak ETag and Vary
    local wetag = h1:match("ETag: ([^\r]+)")
    assert.truthy(wetag:find('^W/"'), wetag)
    local h304 = curl({ "-H", "Accept-Encoding: gzip", "-H", "If-None-Match: " .. wetag, "-D", "-",
      "-o", "/dev/null", base .. "/style.css" })
    assert.truthy(h304:find("^HTTP/1.1 304"), h304)
    assert.equal(wetag, h304:match("ETag: ([^\r]+)"))
    assert.truthy(h304:find("\r\nVary: Accept%-Encoding\r\n"), h304)
    -- br is its own entry
    local _, b3 = get("br", t .. "/3")
    assert.equal(b1, b3)
    assert.equal(s2.http_compress_in + 8400, stats().http_compress_in)
    -- the file changes (same size): compressed again, the new bytes served
    H.write_file(dir .. "/style.css", ("body { color: blu; } "):rep(400))
    local h4, b4 = get("gzip", t .. "/4")
    assert.equal(("body { color: blu; } "):rep(400), b4)
    assert.are_not.equal(h1:match("ETag: ([^\r]+)"), h4:match("ETag: ([^\r]+)"))
    local s4 = stats()
    assert.equal(s2.http_compress_in + 2 * 8400, s4.http_compress_in)
    local _, b5 = get("gzip", t .. "/5")
    assert.equal(b4, b5)
    assert.equal(s4.http_compress_cached + 1, stats().http_compress_cached)
    assert.truthy(srv:alive())
  end)

  it("the compressed-file cache holds at most compress.cache bytes: the least recently used goes, a larger one is never kept", function()
    local dir = H.tmpdir()
    -- hex text compresses to about half: a and b ~2 KB each, c ~4 KB
    math.randomseed(27)
    local function hex(n)
      local t = {}
      for i = 1, n do t[i] = ("%x"):format(math.random(0, 15)) end
      return table.concat(t)
    end
    H.write_file(dir .. "/a.txt", hex(4000))
    H.write_file(dir .. "/b.txt", hex(4000))
    H.write_file(dir .. "/c.txt", hex(8000))
    local srv, port = start({ dir, "nobr", "3000" }, { threads = 1 })
    local base = ("http://127.0.0.1:%d"):format(port)
    local function stats() return cjson.decode(curl({ base .. "/stats" })) end
    local function get(f)
      local out = H.tmpdir() .. "/z"
      local h = curl({ "-H", "Accept-Encoding: gzip", "-D", "-", "-o", out, base .. "/" .. f })
      local len = tonumber(h:match("Content%-Length: (%d+)"))
      assert.truthy(h:find("Content%-Encoding: gzip"), h)
      local st, body = H.exec({ "/usr/bin/gzip", "-dc", out })
      assert.equal(0, st)
      assert.equal(H.read_file(dir .. "/" .. f), body)
      return len
    end
    local s0 = stats()
    local la = get("a.txt")
    assert.truthy(la > 1500 and la < 2900, la) -- one fits, two do not
    get("a.txt") -- from the cache
    local lb = get("b.txt") -- b pushes a out
    assert.truthy(lb > 1500 and la + lb > 3000, lb)
    get("a.txt") -- compressed again; a pushes b out
    get("b.txt") -- compressed again
    local s1 = stats()
    assert.equal(1, s1.http_compress_cached - s0.http_compress_cached)
    assert.equal(4 * 4000, s1.http_compress_in - s0.http_compress_in)
    local lc = get("c.txt")
    assert.truthy(lc > 3000, lc)
    get("c.txt")
    local s2 = stats()
    assert.equal(s1.http_compress_cached, s2.http_compress_cached, "c is never kept")
    assert.equal(2 * 8000, s2.http_compress_in - s1.http_compress_in)
    get("b.txt") -- still there: c pushed nothing out
    assert.equal(s2.http_compress_cached + 1, stats().http_compress_cached)
    assert.truthy(srv:alive())
  end)

  it("res:write streams through one gzip stream, each piece decodable before the next is sent", function()
    local srv, port = start({ public() })
    local r = JS.run("compress_cases.js", { port, "stream", 6 }, 40, srv)
    assert.equal("gzip", r[1].encoding)
    assert.is_true(r[1].chunked)
    assert.same({ 1, 2, 3, 4, 5, 6 }, r[2].pieces)
  end)

  it("br streams when the client ranks br above gzip: res:write piece by piece and SSE event by event through node's brotli decoder, curl --compressed", function()
    local srv, port = start({ public() })
    local r = JS.run("compress_cases.js", { port, "stream", 6, "gzip;q=0.5, br" }, 40, srv)
    assert.equal("br", r[1].encoding)
    assert.is_true(r[1].chunked)
    assert.same({ 1, 2, 3, 4, 5, 6 }, r[2].pieces)
    local e = JS.run("compress_cases.js", { port, "sse", "brch", 8, "br" }, 40, srv)
    assert.equal("br", e[1].encoding)
    assert.equal("Accept-Encoding", e[1].vary)
    local want = { "ready" }
    for i = 1, 8 do want[#want + 1] = "event" .. i end
    assert.same(want, e[2].events)
    -- at equal q a stream goes gzip (a whole body goes br); br off: gzip
    local base = ("http://127.0.0.1:%d"):format(port)
    local function enc(ae, path)
      local h = curl({ "-H", "Accept-Encoding: " .. ae, "-D", "-", "-o", "/dev/null", base .. path })
      return h:match("\r\nContent%-Encoding: (%w+)\r\n")
    end
    assert.equal("gzip", enc("gzip, br", "/pieces?n=50"))
    assert.equal("br", enc("gzip, br", "/json?n=300"))
    assert.equal("br", enc("br", "/pieces?n=50"))
    local body = curl({ "--compressed", "-H", "Accept-Encoding: br", base .. "/pieces?n=500" })
    local n = 0
    for _ in body:gmatch("piece %d+ of a compressible stream\n") do n = n + 1 end
    assert.equal(500, n)
    local nobr, nport = start({ public(), "nobr" })
    assert.equal(nil, curl({ "-H", "Accept-Encoding: br", "-D", "-", "-o", "/dev/null",
      ("http://127.0.0.1:%d/pieces?n=50"):format(nport) }):match("Content%-Encoding"))
    assert.truthy(srv:alive() and nobr:alive())
  end)

  it("SSE: sse:send and forwarded pub/sub events through a gzip stream, each event decoded as it arrives; the byte counts move", function()
    local srv, port = start({ public() })
    local r = JS.run("compress_cases.js", { port, "sse", "zch", 8 }, 40, srv)
    assert.equal("gzip", r[1].encoding)
    assert.equal("Accept-Encoding", r[1].vary)
    local want = { "ready" }
    for i = 1, 8 do want[#want + 1] = "event" .. i end
    assert.same(want, r[2].events)
    local stats = cjson.decode(curl({ ("http://127.0.0.1:%d/stats"):format(port) }))
    assert.truthy(stats.http_compress_in > stats.http_compress_out, cjson.encode(stats))
    assert.truthy(stats.http_compress_out > 0)
  end)

  it("over HTTP/2 (h2c): a whole answer with its compressed length, and a stream, decode as over HTTP/1.1", function()
    local srv, port = start({ public() })
    local base = ("http://127.0.0.1:%d"):format(port)
    local dir = H.tmpdir()
    local head = curl({ "--http2-prior-knowledge", "-H", "Accept-Encoding: gzip", "-D", "-",
      "-o", dir .. "/json.gz", base .. "/json?n=300" })
    assert.truthy(head:find("^HTTP/2 200"), head)
    assert.truthy(head:find("\r\ncontent%-encoding: gzip\r\n"), head)
    assert.truthy(head:find("\r\nvary: Accept%-Encoding\r\n"), head)
    local len = tonumber(head:match("\r\ncontent%-length: (%d+)\r\n"))
    assert.equal(len, #H.read_file(dir .. "/json.gz"))
    local st, json = H.exec({ "/usr/bin/gzip", "-dc", dir .. "/json.gz" })
    assert.equal(0, st)
    assert.equal(300, #cjson.decode(json))
    local streamed = curl({ "--http2-prior-knowledge", "--compressed", "-D", "-", base .. "/pieces?n=200" })
    assert.truthy(streamed:find("\r\ncontent%-encoding: gzip\r\n"), streamed) -- a stream at equal q: gzip
    local n = 0
    for _ in streamed:gmatch("piece %d+ of a compressible stream\n") do n = n + 1 end
    assert.equal(200, n)
    assert.truthy(srv:alive())
  end)
end)
