-- Spec: HTTP/2 in mp.http (src/http/h2.c over nghttp2), end to end through
-- the real binary with clients we did not write: curl (--http2 over TLS
-- with ALPN, --http2-prior-knowledge for h2c), nghttp, h2load, openssl
-- s_client and Node's http2 module.
-- The first part runs the same HTTP-semantics cases (spec/fixtures/
-- http_app.lua, as spec/e2e/http_spec.lua drives them) over HTTP/1.1, h2c
-- and h2 with spec/protocols.lua: the Lua API is the same whatever the
-- client speaks. The rest is HTTP/2's own: negotiation, multiplexing,
-- what RFC 9113 drops or refuses, and the limits.
local H = require "spec.helper"
local P = require "spec.protocols"
local JS = require "spec.js"
local cjson = require "cjson"

local start, cleanup = H.fixture_servers("http_app.lua")
local start_app, cleanup_app = H.fixture_servers("h2_app.lua")

local function binary(n, seed)
  local t, x = {}, seed
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    t[i] = string.char(x % 256)
  end
  return table.concat(t)
end

local function esc(s)
  return (s:gsub("[^%w%-%._~/]", function(ch) return ("%%%02X"):format(ch:byte()) end))
end

describe("HTTP/2", function()
  after_each(function()
    cleanup()
    cleanup_app()
  end)

  describe("the same cases over HTTP/1.1, h2c and h2 (spec/protocols.lua)", function()
    P.each(function(proto)
      describe(proto.name, function()
        it("GET: status, Date, Content-Length, Content-Type, body; 404; HEAD has the length and no body", function()
          local base = proto.start(start)
          local r = proto.curl_i { base .. "/hello" }
          assert.equal(200, r.status)
          assert.equal("hello world\n", r.body)
          assert.equal("12", r.headers["content-length"])
          assert.equal("text/plain; charset=utf-8", r.headers["content-type"])
          assert.truthy(r.headers.date:match("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$"), r.headers.date)
          r = proto.curl_i { base .. "/nope?q=1" }
          assert.equal(404, r.status)
          assert.equal("q=1", r.headers["x-query"])
          r = proto.curl_i { "-I", base .. "/hello" }
          assert.equal(200, r.status)
          assert.equal("12", r.headers["content-length"])
          assert.equal("", r.body)
        end)

        it("hands the handler method, decoded path, raw query and target, version, lower-case headers (repeats joined), body", function()
          local base, _, port = proto.start(start)
          -- (HTTP/2 refuses blanks around a value, RFC 9113 8.2.1: below)
          local mixed = proto.version == "2" and "X-Mixed-CASE:   Value" or "X-Mixed-CASE:   Value  "
          local st, out, err = proto.curl { base .. "/echo/a%20b%2Fc%C3%A9?x=1%202&y=%2F",
            "-H", "X-Rep: one", "-H", "X-Rep: two", "-H", mixed }
          assert.equal(0, st, err)
          local e = cjson.decode(out)
          assert.equal("GET", e.method)
          assert.equal("/echo/a b/c\xc3\xa9", e.path)
          assert.equal("x=1%202&y=%2F", e.query)
          assert.equal("/echo/a%20b%2Fc%C3%A9?x=1%202&y=%2F", e.target)
          assert.equal(proto.version, e.version)
          assert.equal("one, two", e.headers["x-rep"])
          assert.equal("Value", e.headers["x-mixed-case"])
          assert.equal((proto.tls and "localhost:%d" or "127.0.0.1:%d"):format(port), e.headers.host)
          for k in pairs(e.headers) do assert.equal(k:lower(), k) end
          assert.equal("", e.body)
          st, out, err = proto.curl { "-X", "PUT", "--data-binary", "put body", base .. "/echo/v" }
          assert.equal(0, st, err)
          e = cjson.decode(out)
          assert.same({ "PUT", "/echo/v", "", proto.version, "put body", 8 },
            { e.method, e.path, e.query, e.version, e.body, e.body_len })
          st, out, err = proto.curl { "-X", "DELETE", base .. "/echo" }
          assert.equal(0, st, err)
          assert.equal("DELETE", cjson.decode(out).method)
          if proto.version == "2" then -- a malformed field: the stream is reset
            st, out, err = proto.curl { "-H", "X-Blank: value ", base .. "/echo" }
            assert.are_not.equal(0, st, out)
            assert.truthy(err:find("PROTOCOL_ERROR", 1, true), err)
          end
        end)

        it("res:status, res:header chains, res:json, res:redirect, an unanswered request, 204 without a body, 60 response headers", function()
          local base = proto.start(start)
          local r = proto.curl_i { base .. "/status?code=201&body=made" }
          assert.equal(201, r.status)
          assert.equal("made", r.body)
          r = proto.curl_i { base .. "/json?status=202" }
          assert.equal(202, r.status)
          assert.equal("application/json", r.headers["content-type"])
          assert.equal(42, cjson.decode(r.body).n)
          r = proto.curl_i { base .. "/redirect?to=/hello" }
          assert.equal(302, r.status)
          assert.equal("/hello", r.headers.location)
          r = proto.curl_i { base .. "/empty" }
          assert.equal(200, r.status)
          assert.equal("0", r.headers["content-length"])
          r = proto.curl_i { base .. "/empty?code=204" }
          assert.equal(204, r.status)
          assert.equal("", r.body)
          assert.is_nil(r.headers["content-length"])
          r = proto.curl_i { base .. "/headers?n=60&len=50" }
          assert.equal("ok", r.body)
          for i = 1, 60 do assert.equal(50, #r.headers["x-h" .. i], "x-h" .. i) end
        end)

        it("request bodies: 300 KB binary back byte for byte, 1.5 MiB with max_body raised, a form, 413 over max_body", function()
          local base = proto.start(start, { "max_body=2000000" })
          local dir = H.tmpdir()
          local data = binary(300000, 7)
          H.write_file(dir .. "/up.bin", data)
          local st, out, err = proto.curl { "--data-binary", "@" .. dir .. "/up.bin", base .. "/raw" }
          assert.equal(0, st, err)
          assert.is_true(out == data, "the body came back changed")
          local big = binary(1500000, 3)
          H.write_file(dir .. "/big.bin", big)
          local _
          st, _, err = proto.curl { "-o", dir .. "/got", "--data-binary", "@" .. dir .. "/big.bin", base .. "/raw" }
          assert.equal(0, st, err)
          assert.is_true(H.read_file(dir .. "/got") == big, "1.5 MiB came back changed")
          st, out, err = proto.curl { "--data", "a=1&b=x+y&a=2", base .. "/form?q=3" }
          assert.equal(0, st, err)
          local f = cjson.decode(out).form
          assert.same({ a = "2", b = "x y", q = "3" }, f)
          H.write_file(dir .. "/huge.bin", binary(2100000, 5))
          local r = proto.curl_i { "--data-binary", "@" .. dir .. "/huge.bin", base .. "/raw" }
          assert.equal(413, r.status)
        end)

        it("res:write streams; res:sendfile sends a file and HEAD gets its length; a handler that waits in mp.sleep; a Lua error is a 500 and the connection goes on", function()
          local base = proto.start(start)
          local r = proto.curl_i { base .. "/stream?ms=20" }
          assert.equal(200, r.status)
          assert.equal("part1\npart2\npart3\n", r.body)
          local dir = H.tmpdir()
          local data = binary(300000, 99)
          H.write_file(dir .. "/blob.bin", data)
          local st, _, err = proto.curl { "-o", dir .. "/got", base .. "/file?path=" .. esc(dir .. "/blob.bin") }
          assert.equal(0, st, err)
          assert.is_true(H.read_file(dir .. "/got") == data, "sendfile sent other bytes")
          r = proto.curl_i { "-I", base .. "/file?path=" .. esc(dir .. "/blob.bin") }
          assert.equal("300000", r.headers["content-length"])
          r = proto.curl_i { base .. "/sleep?ms=50" }
          assert.equal("slept 50", r.body)
          -- an error, then a request on the same connection (curl 7.88 can't
          -- reuse an h2c connection: nghttp sends both on one)
          local out
          if proto.name:find("h2c") then
            st, out, err = H.exec({ "/usr/bin/nghttp", "-v", base .. "/error", base .. "/hello" },
              { timeout = H.T(20) })
            assert.equal(0, st, err)
            assert.truthy(out:find(":status: 500", 1, true), out)
            assert.truthy(out:find("hello world\n", 1, true), out)
            local _, opened = out:gsub("recv SETTINGS frame <length=%d+, flags=0x00", "")
            assert.equal(1, opened, "one connection")
          else
            st, out, err = proto.curl { "-v", base .. "/error", base .. "/hello" }
            assert.equal(0, st, err)
            assert.truthy(out:find("hello world\n", 1, true), out)
            assert.truthy(err:find("< HTTP/[%d.]+ 500"), err)
            assert.truthy(err:find("Re%-using existing connection") or err:find("Reusing existing"), err)
          end
        end)

        it("--log writes the combined-format line with the protocol's version", function()
          local dir = H.tmpdir()
          local path = dir .. "/access.log"
          local base, srv = proto.start(start, {}, { options = { "--log", path } })
          local st, _, err = proto.curl { base .. "/hello?x=1", "-A", "agent", "-e", "http://ref/" }
          assert.equal(0, st, err)
          H.wait_for(function() return (H.read_file(path) or ""):find("\n") end, H.T(5), "a log line")
          local line = H.lines(H.read_file(path))[1]
          local v = proto.version == "2" and "HTTP/2%.0" or "HTTP/1%.1"
          assert.truthy(line:match('^127%.0%.0%.1 %- %- %[[^%]]+%] "GET /hello%?x=1 ' .. v ..
            '" 200 12 "http://ref/" "agent" %d+%.%d%d%d$'), line)
          assert.equal(0, srv:stop())
        end)

        it("stream_body: req:read() hands over an 8 MiB body in pieces (flow control paces the client), req.body is nil; a body not read; no body", function()
          local base = proto.start(start, { "stream_body=1", "max_body=67108864" })
          local dir = H.tmpdir()
          local big = binary(8 * 1048576, 11)
          H.write_file(dir .. "/big.bin", big)
          local r = proto.curl_i({ "--data-binary", "@" .. dir .. "/big.bin", base .. "/read?every=8&ms=1" }, H.T(60))
          assert.equal(200, r.status)
          assert.is_true(r.body == big, "the body came back different (" .. #r.body .. " bytes)")
          assert.is_true(tonumber(r.headers["x-chunks"]) > 1, r.headers["x-chunks"])
          assert.equal("true", r.headers["x-body-nil"])
          if proto.version == "2" then
            -- the rest of a body nobody reads is taken and dropped (curl
            -- 7.88 stops sending once it has the answer: nghttp here)
            local st, out, err = H.exec({ "/usr/bin/nghttp", "-d", dir .. "/big.bin",
              (base:gsub("^https://localhost", "https://127.0.0.1")) .. "/noread" }, { timeout = H.T(30) })
            assert.equal(0, st, err)
            assert.equal("not read", out)
          else
            r = proto.curl_i { "--data-binary", "@" .. dir .. "/big.bin", base .. "/noread" }
            assert.equal("not read", r.body)
          end
          r = proto.curl_i { base .. "/read" }
          assert.equal("", r.body)
          assert.equal("0", r.headers["x-chunks"])
          r = proto.curl_i { "--data-binary", "0123456789", base .. "/read" }
          assert.equal("0123456789", r.body)
        end)

        it("static files from public: the file, ETag and 304, Range (206), index.html, a .gz sibling", function()
          local dir = H.tmpdir()
          local data = binary(200000, 21)
          H.write_file(dir .. "/blob.bin", data)
          H.write_file(dir .. "/index.html", "<p>hi</p>\n")
          local base = proto.start(start, { "public=" .. dir })
          local r = proto.curl_i { base .. "/blob.bin" }
          assert.equal(200, r.status)
          assert.is_true(r.body == data, "the file came back different")
          assert.equal("200000", r.headers["content-length"])
          local etag = assert(r.headers.etag, "an ETag")
          r = proto.curl_i { "-H", "If-None-Match: " .. etag, base .. "/blob.bin" }
          assert.equal(304, r.status)
          assert.equal("", r.body)
          r = proto.curl_i { "-r", "1000-1999", base .. "/blob.bin" }
          assert.equal(206, r.status)
          assert.equal("bytes 1000-1999/200000", r.headers["content-range"])
          assert.is_true(r.body == data:sub(1001, 2000), "the range came back different")
          r = proto.curl_i { base .. "/" }
          assert.equal("<p>hi</p>\n", r.body)
          assert.truthy(r.headers["content-type"]:find("text/html", 1, true))
          -- a .gz sibling for a client that takes gzip (gzip(1) made it)
          local text = string.rep("compress me, ", 500)
          H.write_file(dir .. "/c.txt", text)
          local st, _, err = H.exec { "/bin/gzip", "-k", "-9", dir .. "/c.txt" }
          assert.equal(0, st, err)
          r = proto.curl_i { "--compressed", base .. "/c.txt" }
          assert.equal("gzip", r.headers["content-encoding"])
          assert.equal("Accept-Encoding", r.headers.vary)
          assert.equal(tostring(#H.read_file(dir .. "/c.txt.gz")), r.headers["content-length"])
          assert.is_true(r.body == text, "curl's decoded body differs")
        end)

        it("mp.router with :params, req:json, req.cookies (split cookie fields joined again), 405 and a route's error", function()
          local base = proto.start(start_app)
          local r = proto.curl_i { base .. "/users/42" }
          assert.same({ id = "42", version = proto.version }, cjson.decode(r.body))
          r = proto.curl_i { "-H", "Content-Type: application/json", "--data", '{"a":[1,2],"b":"c"}', base .. "/json" }
          assert.same({ got = { a = { 1, 2 }, b = "c" } }, cjson.decode(r.body))
          r = proto.curl_i { "--data", "{bad", base .. "/json" }
          assert.equal(400, r.status)
          -- HTTP/2 clients may split Cookie (RFC 9113 8.2.3): joined again
          r = proto.curl_i(proto.version == "2" and { "-H", "Cookie: a=1; b=2", "-H", "Cookie: c=3", base .. "/cookies" }
            or { "-H", "Cookie: a=1; b=2; c=3", base .. "/cookies" })
          assert.same({ a = "1", b = "2", c = "3" }, cjson.decode(r.body))
          r = proto.curl_i { "-X", "PUT", base .. "/users/1" }
          assert.equal(405, r.status)
          r = proto.curl_i { base .. "/boom" }
          assert.equal(500, r.status)
        end)
      end)
    end)
  end)

  describe("negotiation", function()
    it("TLS: ALPN picks h2 over http/1.1 (openssl s_client, curl); http2 = false offers http/1.1 only", function()
      local base, _, port = P.list[3].start(start_app)
      local _, out = H.exec({ H.openssl, "s_client", "-connect", "127.0.0.1:" .. port,
        "-servername", "localhost", "-alpn", "h2,http/1.1" }, { timeout = H.T(10) })
      assert.truthy(out:find("ALPN protocol: h2", 1, true), out)
      _, out = H.exec({ H.openssl, "s_client", "-connect", "127.0.0.1:" .. port,
        "-servername", "localhost", "-alpn", "http/1.1" }, { timeout = H.T(10) })
      assert.truthy(out:find("ALPN protocol: http/1.1", 1, true), out)
      local r = P.list[3].curl_i { base .. "/" }
      assert.equal("home", r.body)
      -- http2 = false
      local base2 = P.list[3].start(start_app, { "http2=false" })
      local st2, out2, err2 = P.list[3].curl { "-i", base2 .. "/" }
      assert.equal(0, st2, err2)
      assert.equal("1.1", P.parse(out2).version)
    end)

    it("cleartext: the h2 preface without h2c = true is refused as HTTP/1.1 (400, as before); with it, h2c and HTTP/1.1 share the port", function()
      local _, port = start_app({})
      local c = H.connect(port)
      H.send(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
      local text = H.read_to_eof(c, H.T(5))
      assert.truthy(text:find("^HTTP/1.1 400"), text)
      local base = P.list[2].start(start_app)
      assert.equal("2", P.list[2].curl_i({ base .. "/users/1" }).version)
      assert.equal("1.1", P.list[1].curl_i({ base .. "/users/1" }).version)
    end)

    it("Upgrade: h2c (h2c = true): curl --http2 and nghttp -u get 101 and the request answered as stream 1; HEAD; without h2c = true it stays HTTP/1.1", function()
      local base = P.list[2].start(start_app)
      local function curl(args)
        local argv = { "/usr/bin/curl", "-sS", "-i", "--noproxy", "*", "--max-time", tostring(H.T(10)), "--http2" }
        for _, a in ipairs(args) do argv[#argv + 1] = a end
        local st, out, err = H.exec(argv, { timeout = H.T(20) })
        assert.equal(0, st, err)
        return out
      end
      local out = curl { base .. "/users/3" }
      assert.truthy(out:find("^HTTP/1.1 101 Switching Protocols\r\n"), out)
      local r = P.parse(out)
      assert.equal("2", r.version)
      assert.equal(200, r.status)
      assert.same({ id = "3", version = "2" }, cjson.decode(r.body))
      -- HEAD: the length, no body
      r = P.parse(curl { "-I", base .. "/users/3" })
      assert.equal("2", r.version)
      assert.equal("24", r.headers["content-length"])
      assert.equal("", r.body)
      -- nghttp -u: the first URL by the upgrade (stream 1), the others
      -- as HTTP/2 streams of the same connection
      local st, nout, err = H.exec({ "/usr/bin/nghttp", "-uv", base .. "/users/1", base .. "/users/2", base .. "/" },
        { timeout = H.T(20) })
      assert.equal(0, st, err)
      assert.truthy(nout:find("HTTP Upgrade response", 1, true), nout)
      assert.truthy(nout:find("HTTP Upgrade success", 1, true), nout)
      assert.truthy(nout:find("recv (stream_id=1) :status: 200", 1, true), nout)
      local n = 0
      for _ in nout:gmatch(":status: 200") do n = n + 1 end
      assert.equal(3, n, nout)
      assert.truthy(nout:find('{"id":"2","version":"2"}', 1, true) or nout:find('{"version":"2","id":"2"}', 1, true), nout)
      -- h2c off: the Upgrade field is ignored
      local base1 = P.list[1].start(start_app)
      r = P.parse(curl { base1 .. "/users/3" })
      assert.equal("1.1", r.version)
      assert.same({ id = "3", version = "1.1" }, cjson.decode(r.body))
    end)

    it("Upgrade: h2c refused cleanly, served as HTTP/1.1: a malformed or bad HTTP2-Settings, two of them, none, a request with a body", function()
      local _, _, port = P.list[2].start(start_app)
      local function ask(head, body)
        local c = H.connect(port)
        H.send(c, head .. "\r\n" .. (body or ""))
        local text, err, part = H.read_until(c, "}", H.T(5))
        c:close()
        assert.truthy(text, tostring(err) .. ": " .. head .. " -> " .. tostring(part))
        assert.truthy(text:find("^HTTP/1.1 200 "), text)
        return text
      end
      local up = "Host: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
      for _, settings in ipairs {
        "HTTP2-Settings: !!!not base64!!!\r\n",
        "HTTP2-Settings: AAMA\r\n",                       -- 3 bytes: not whole settings
        "HTTP2-Settings: AAIAAAAC\r\n",                   -- ENABLE_PUSH = 2
        "HTTP2-Settings: AAQAAAAA\r\nHTTP2-Settings: AAQAAAAA\r\n", -- two fields
        "HTTP2-Settings: " .. ("AAQAAAAA"):rep(200) .. "\r\n", -- past the bound
        "",                                                 -- none
      } do
        local text = ask("GET /users/4 HTTP/1.1\r\n" .. up .. settings)
        assert.truthy(text:find('"version":"1.1"', 1, true), settings .. text)
      end
      -- a body (as nghttpd: the request is answered over HTTP/1.1)
      local text = ask("POST /json HTTP/1.1\r\n" .. up .. "HTTP2-Settings: AAMAAABk\r\n" ..
        "Content-Type: application/json\r\nContent-Length: 7\r\n", '{"a":1}')
      assert.truthy(text:find('{"got":{"a":1}}', 1, true), text)
      -- curl --http2 with a POST body: answered, whatever curl offers
      local st, out, err = H.exec({ "/usr/bin/curl", "-sS", "-i", "--http2", "--max-time", tostring(H.T(10)),
        "-H", "Content-Type: application/json", "--data", '{"b":2}', "http://127.0.0.1:" .. port .. "/json" },
        { timeout = H.T(20) })
      assert.equal(0, st, err)
      assert.same({ got = { b = 2 } }, cjson.decode(P.parse(out).body))
      -- and the port still upgrades a good one
      local c = H.connect(port)
      H.send(c, "GET /users/4 HTTP/1.1\r\n" .. up .. "HTTP2-Settings: AAMAAABk\r\n\r\n")
      local sw = H.read_until(c, "\r\n\r\n", H.T(5))
      c:close()
      assert.truthy(sw:find("^HTTP/1.1 101 "), sw)
    end)

    it("an event stream over h2 stays on h2 (res:sse writes through its stream: spec/e2e/h2_sse_spec.lua)", function()
      local base = P.list[3].start(start_app)
      local argv = { "/usr/bin/curl", "-sS", "-N", "-v", "--max-time", tostring(H.T(10)) }
      for _, a in ipairs(P.list[3].curl_args) do argv[#argv + 1] = a end
      argv[#argv + 1] = base .. "/sse"
      local q = H.spawn(argv)
      q.sanitizer_checked = true
      H.wait_for(function() return q:stdout():find("data: one\n\n", 1, true) end, H.T(5),
        function() return q:stdout() .. q:stderr() end)
      assert.falsy(q:stderr():find("HTTP_1_1_REQUIRED", 1, true), q:stderr())
      assert.truthy(q:stderr():find("< HTTP/2 200", 1, true), q:stderr())
      assert.truthy(q:stderr():find("< content-type: text/event-stream", 1, true), q:stderr())
      q:kill(H.SIGKILL)
      q:wait_exit(5)
    end)
  end)

  describe("multiplexing", function()
    it("nghttp: 30 streams on one connection, the server's SETTINGS (100 streams, max_header) and every answer", function()
      local base = P.list[3].start(start_app, { "max_header=16384" })
      local urls = {}
      for i = 1, 30 do urls[#urls + 1] = base .. "/users/" .. i end
      local argv = { "/usr/bin/nghttp", "-nv", "--no-verify-peer" }
      for _, u in ipairs(urls) do argv[#argv + 1] = u end
      local st, out, err = H.exec(argv, { timeout = H.T(20) })
      assert.equal(0, st, err)
      assert.truthy(out:find("SETTINGS_MAX_CONCURRENT_STREAMS%(0x03%):100"), out)
      assert.truthy(out:find("SETTINGS_MAX_HEADER_LIST_SIZE%(0x06%):16384"), out)
      local n = 0
      for _ in out:gmatch(":status: 200") do n = n + 1 end
      assert.equal(30, n, out)
    end)

    it("h2load: 2,000 requests on 4 connections x 20 streams, over TLS and h2c, all 2xx", function()
      for _, i in ipairs { 2, 3 } do
        local base = P.list[i].start(start_app, i == 2 and {} or nil)
        local st, out, err = H.exec({ "/usr/bin/h2load", "-n", "2000", "-c", "4", "-m", "20", base .. "/users/1" },
          { timeout = H.T(60) })
        assert.equal(0, st, err)
        assert.truthy(out:find("2000 succeeded, 0 failed", 1, true), out)
        assert.truthy(out:find("status codes: 2000 2xx", 1, true), out)
      end
    end)

    it("metrics by protocol: /metrics and mp.stats() count requests and response body bytes of HTTP/1.1 and HTTP/2 apart (curl, nghttp)", function()
      local base = P.list[2].start(start_app, { "status=/metrics" })
      local h1, h2 = P.list[1], P.list[2]
      -- the JSON's key order is a lane's: lengths are what stays the same
      local function get_user(proto)
        local body = proto.curl_i({ base .. "/users/1" }).body
        assert.same({ id = "1", version = proto.version }, cjson.decode(body))
        return #body
      end
      local b1, b2 = get_user(h1), get_user(h2)
      assert.are_not.equal(b1, b2) -- the version is in the body
      for _ = 1, 2 do assert.equal(b1, get_user(h1)) end
      assert.equal(b2, get_user(h2))
      -- nghttp: 4 streams on one h2c connection (prior knowledge; it
      -- fetches a repeated URL once, so 4 ids of the same length)
      local argv = { "/usr/bin/nghttp", "-n" }
      for i = 1, 4 do argv[#argv + 1] = base .. "/users/" .. i end
      local st, _, err = H.exec(argv, { timeout = H.T(20) })
      assert.equal(0, st, err)
      -- Each scrape is itself a 1.1 answer, counted once it is whole (on
      -- its lane, maybe after its client has it): the 1.1 figures may
      -- include any number of the earlier scrapes, in order.
      local lens = {}
      local function before(k)
        local t = 0
        for i = 1, k do t = t + lens[i] end
        return t
      end
      local function check_h1(n, bytes, upto)
        local d = n - 3
        assert.truthy(d >= 0 and d <= upto, "1.1 requests " .. n)
        assert.equal(3 * b1 + before(d), bytes)
      end
      local function scrape()
        local r = h1.curl_i { base .. "/metrics" }
        assert.equal(200, r.status)
        local function get(name, proto)
          local v = r.body:match(name .. '{protocol="' .. proto:gsub("%.", "%%.") .. '"} (%d+)')
          assert.truthy(v, name .. " " .. proto .. " missing:\n" .. r.body)
          return tonumber(v)
        end
        lens[#lens + 1] = #r.body
        return get("moonport_http_protocol_requests_total", "1.1"), get("moonport_http_protocol_requests_total", "2"),
          get("moonport_http_response_body_bytes_total", "1.1"), get("moonport_http_response_body_bytes_total", "2")
      end
      local n1, n2, by1, by2
      H.wait_for(function()
        n1, n2, by1, by2 = scrape()
        return n2 == 6 and by2 == 6 * b2 and n1 >= 3
      end, H.T(10), function() return ("%s %s %s %s"):format(n1, n2, by1, by2) end)
      check_h1(n1, by1, #lens - 1)
      -- mp.stats() over h2 (its own answer is counted after it)
      local s = cjson.decode(h2.curl_i({ base .. "/stats" }).body)
      assert.equal(6, s["2"].requests)
      assert.equal(6 * b2, s["2"].body_bytes)
      check_h1(s["1.1"].requests, s["1.1"].body_bytes, #lens)
      H.wait_for(function()
        n1, n2, by1, by2 = scrape()
        return n2 == 7
      end, H.T(10), function() return ("%s %s %s %s"):format(n1, n2, by1, by2) end)
      check_h1(n1, by1, #lens - 1)
    end)

    it("Connection-specific response headers are dropped (RFC 9113 8.2.2); other headers stay", function()
      local base = P.list[3].start(start_app)
      local r = P.list[3].curl_i { base .. "/connhdr" }
      assert.equal("ok", r.body)
      assert.equal("yes", r.headers["x-kept"])
      for _, h in ipairs { "connection", "keep-alive", "upgrade", "proxy-connection" } do
        assert.is_nil(r.headers[h], h)
      end
      -- over HTTP/1.1 they go out as set
      local r1 = P.list[1].curl_i { ("http://127.0.0.1:%d/connhdr"):format(select(3, P.list[1].start(start_app))) }
      assert.equal("foo", r1.headers.upgrade)
    end)
  end)

  describe("mp.upstream behind h2", function()
    local start_px = select(1, H.fixture_servers("h2_proxy_app.lua"))
    it("up:proxy answers h2 clients: a GET, a 1 MiB body (buffered and streamed with stream_body), an 8 MiB answer", function()
      local dir = H.tmpdir()
      local body = binary(1048576, 9)
      H.write_file(dir .. "/b.bin", body)
      for _, mode in ipairs { {}, { "s" } } do
        local up_port = H.free_port()
        local args = { up_port }
        for _, x in ipairs(mode) do args[#args + 1] = x end
        local srv, port = start_px(args)
        H.wait_for(function() return srv:listens_on(up_port) end, H.T(5), "the upstream's port")
        local base = ("http://127.0.0.1:%d"):format(port)
        local h2c = P.list[2]
        assert.equal("up GET 0", h2c.curl_i({ base .. "/a" }).body)
        assert.equal("up POST 1048576", h2c.curl_i({ "--data-binary", "@" .. dir .. "/b.bin", base .. "/p" }).body)
        local st, _, err = h2c.curl { "-o", dir .. "/big", base .. "/big" }
        assert.equal(0, st, err)
        assert.equal(8388608, #H.read_file(dir .. "/big"))
      end
    end)
  end)

  describe("Expect: 100-continue", function()
    it("a 100 HEADERS goes before the body is read (curl waits for it: --expect100-timeout 60 under --max-time 20); a body over max_body gets 413 and no 100", function()
      for _, i in ipairs { 2, 3 } do
        local proto = P.list[i]
        local base = proto.start(start_app)
        local dir = H.tmpdir()
        H.write_file(dir .. "/ok.json", cjson.encode { pad = string.rep("p", 300000) })
        H.write_file(dir .. "/big.json", string.rep(" ", 1100000) .. "{}")
        local function post(file)
          local argv = { "-sS", "-v", "--max-time", tostring(H.T(20)), "--expect100-timeout", "60",
            "-H", "Expect: 100-continue", "-H", "Content-Type: application/json",
            "--data-binary", "@" .. dir .. "/" .. file, base .. "/json" }
          return proto.curl(argv, H.T(30))
        end
        local st, out, err = post("ok.json")
        assert.equal(0, st, err)
        local c100, c200 = err:find("< HTTP/2 100", 1, true), err:find("< HTTP/2 200", 1, true)
        assert.truthy(c100 and c200 and c100 < c200, err)
        assert.equal(300000, #cjson.decode(out).got.pad)
        st, out, err = post("big.json")
        assert.equal(0, st, err)
        assert.truthy(err:find("< HTTP/2 413", 1, true), err)
        assert.truthy(out:find("Too Large", 1, true), out)
        assert.falsy(err:find("< HTTP/2 100", 1, true), err)
      end
    end)
  end)

  describe("mp.upstream behind h2: back pressure", function()
    local start_px = select(1, H.fixture_servers("h2_proxy_app.lua"))
    it("a slow h2 reader of a proxied answer larger than a stream's 16 MiB cap gets all of it: the upstream pauses on the stream's buffer; memory stays bounded", function()
      local mib = H.scale > 1 and 20 or 40
      local dir = H.tmpdir()
      H.write_file(dir .. "/huge", string.rep("0123456789abcdef", mib * 65536))
      local up_port = H.free_port()
      local srv, port = start_px({ up_port, "-", dir .. "/huge" })
      H.wait_for(function() return srv:listens_on(up_port) end, H.T(5), "the upstream's port")
      local rss0 = srv:rss_kb()
      local st, out, err = H.exec({ "/usr/bin/python3", H.fixture("h2_sse_client.py"), port, "slowget", "/file" },
        { timeout = H.T(120) })
      assert.equal(0, st, err)
      local r = cjson.decode(H.lines(out)[1])
      assert.equal("200", r.status, out)
      assert.equal(mib * 1048576, r.bytes, out)
      assert.is_true(r.intact)
      assert.equal(cjson.null, r.reset)
      -- a sanitizer's RSS counts its shadow and quarantine too (H.sanitized):
      -- the bound there is three times the release build's 12 MiB
      local grown, slack = srv:rss_kb() - rss0, 12 * 1024 * (H.sanitized and 3 or 1)
      assert.truthy(grown < slack, "RSS grew by " .. grown .. " KiB for a " .. mib .. " MiB answer")
    end)
  end)

  describe("limits and floods (spec/fixtures/h2_flood.py writes the frames)", function()
    local PY = "/usr/bin/python3"
    local function flood(port, case, n, extra)
      local argv = { PY, H.fixture("h2_flood.py"), port, case, n or 100000 }
      if extra then argv[#argv + 1] = extra end
      local st, out, err = H.exec(argv, { timeout = H.T(60) })
      assert.equal(0, st, err)
      local r = cjson.decode(H.lines(out)[1])
      for k, v in pairs(r) do
        if v == cjson.null then r[k] = nil end -- (JSON null: nil here)
      end
      return r
    end
    -- CPU seconds the server spent (utime + stime, clock ticks of 1/100 s)
    local function cpu(srv)
      local s = H.read_file("/proc/" .. srv:pid() .. "/stat")
      local f = {}
      for x in s:gsub("^.*%) ", ""):gmatch("%S+") do f[#f + 1] = x end
      return (tonumber(f[12]) + tonumber(f[13])) / 100
    end

    it("Rapid Reset, CONTINUATION, SETTINGS, PING, PRIORITY and empty-DATA floods end in GOAWAY after bounded work; other clients are served meanwhile; RSS and CPU stay bounded", function()
      local base, srv, port = P.list[2].start(start_app)
      local rss0, cpu0 = srv:rss_kb(), cpu(srv)
      local want = { rapid_reset = true, continuation = true, settings = 11, ping = 11,
                     priority = 11, empty_data = 11 }
      for _, case in ipairs { "rapid_reset", "continuation", "settings", "ping", "priority", "empty_data" } do
        local r = flood(port, case)
        assert.is_true(r.closed, case .. ": " .. cjson.encode(r))
        assert.is_not_nil(r.goaway, case .. ": no GOAWAY")
        if want[case] ~= true then assert.equal(want[case], r.goaway, case .. " (ENHANCE_YOUR_CALM)") end
        assert.is_true(r.sent < 5000, case .. ": the server took " .. r.sent .. " frames before it stopped")
        -- another client meanwhile
        assert.equal("home", P.list[2].curl_i({ base .. "/" }).body)
      end
      assert.is_true(srv:rss_kb() - rss0 < 64 * 1024, ("RSS grew %d kB"):format(srv:rss_kb() - rss0))
      assert.is_true(cpu(srv) - cpu0 < H.T(5), ("%.2f s of CPU for the floods"):format(cpu(srv) - cpu0))
    end)

    it("header lists: a head over max_header (an HPACK bomb: one 4 KiB field named 4,000 times) is a 431 and the connection goes on; a connection-specific request field resets its stream (RFC 9113 8.2.2)", function()
      local _, _, port = P.list[2].start(start_app)
      local r = flood(port, "hpack_bomb", 4000)
      assert.equal(200, r.first)
      assert.equal(431, r.status, cjson.encode(r))
      assert.is_false(r.closed)
      r = flood(port, "conn_header")
      assert.equal(1, r.rst, "PROTOCOL_ERROR for connection: keep-alive")
      assert.equal(200, r.status, "te: trailers is allowed")
    end)

    it("max_concurrent_streams (default 100, set 10 here): a client past it is told GOAWAY", function()
      local _, _, port = P.list[2].start(start_app, { "max_concurrent_streams=10" })
      local r = flood(port, "streams", 11)
      assert.is_true(r.closed or r.refused > 0, cjson.encode(r))
      local ok = flood(port, "streams", 10)
      assert.is_nil(ok.goaway, cjson.encode(ok))
    end)

    it("a zero window stalls the answer until timeout closes the connection; a bare preface is closed at header_timeout", function()
      local _, _, port = P.list[2].start(start_app,
        { "timeout=" .. H.T(1), "header_timeout=" .. H.T(1) })
      local r = flood(port, "stall", H.T(10), "/big/1024")
      assert.equal(200, r.status)
      assert.equal(0, r.data)
      assert.is_true(r.closed, cjson.encode(r))
      assert.is_true(r.seconds < H.T(6), cjson.encode(r))
      r = flood(port, "preface", H.T(10))
      assert.is_true(r.closed, cjson.encode(r))
      assert.is_true(r.seconds >= 0.9 and r.seconds < H.T(6), cjson.encode(r))
    end)
  end)

  describe("shutdown", function()
    it("SIGTERM: GOAWAY (NO_ERROR) goes out, the stream in flight ends whole, then the connection closes and the server exits 0", function()
      local _, srv, port = P.list[2].start(start_app)
      local st, out, err = H.exec({ "/usr/bin/python3", H.fixture("h2_flood.py"), port, "graceful", 500, srv:pid() },
        { timeout = H.T(30) })
      assert.equal(0, st, err)
      local r = cjson.decode(H.lines(out)[1])
      assert.equal(200, r.status)
      assert.equal(0, r.goaway, out)
      assert.equal(6, r.first, "\"first\\n\" before the signal")
      assert.equal(13, r.data, "the whole body: " .. out)
      assert.is_true(r.closed)
      assert.equal(0, (srv:stop(H.SIGTERM, H.T(5))))
    end)

    it("a reload (SIGHUP, -w 2): the old worker's GOAWAY, the stream in flight ends whole; the next connection is served by the new code", function()
      local base, srv, port = P.list[2].start(start_app, {}, { workers = 2 })
      local st, out, err = H.exec({ "/usr/bin/python3", H.fixture("h2_flood.py"), port, "graceful", 500, srv:pid(),
        "SIGHUP" }, { timeout = H.T(30) })
      assert.equal(0, st, err)
      local r = cjson.decode(H.lines(out)[1])
      assert.equal(200, r.status)
      assert.equal(0, r.goaway, out)
      assert.equal(13, r.data, "the whole body: " .. out)
      assert.is_true(r.closed)
      assert.equal("home", P.list[2].curl_i({ base .. "/" }).body)
    end)
  end)

  describe("Chromium", function()
    local missing = JS.missing() or (not H.exists("/usr/bin/chromium") and "no /usr/bin/chromium")
    it("loads a page over h2: its script sees nextHopProtocol \"h2\" for the page and a fetch" ..
      (missing and (" (skipped: " .. missing .. ")") or ""), function()
      if missing then return end
      local _, srv, port = P.list[3].start(start_app)
      local rows = JS.run("h2_browser.js", { port }, 60, srv)
      local r = assert(JS.find(rows, "case", "browser"), cjson.encode(rows))
      assert.equal("h2", r.nav)
      assert.equal("h2", r.fetched)
      assert.equal("2", r.version)
      assert.is_true(r.ok)
      for _, row in ipairs(rows) do assert.is_nil(row.pageerror, row.pageerror) end
    end)
  end)

  describe("Node's http2 client", function()
    local missing = JS.missing()
    it("concurrent GETs, a 1 MiB POST and a 4 MiB streamed response on one session, verified against the test CA" ..
      (missing and (" (skipped: " .. missing .. ")") or ""), function()
      if missing then return end
      local base, srv, port = P.list[3].start(start_app, { "max_body=2000000" })
      local ca = P.list[3].curl_args[3]
      local rows = JS.run("h2_cases.js", { port, "session", ca }, 30, srv)
      local r = assert(JS.find(rows, "case", "session"))
      assert.equal("h2", r.alpn)
      assert.same({ 200, 200, 200, 200, 200 }, r.gets)
      assert.equal(1048576, r.posted)
      assert.equal(4 * 1048576, r.big)
      assert.equal(1, r.sessions)
      assert.is_not_nil(base)
    end)
  end)
end)
