-- Spec: the TLS server (mp.http and mp.listen with `tls = {...}`), proven
-- with clients we did not write: curl, openssl s_client, Node's https and
-- tls modules and the npm ws client, each trusting only a test CA made
-- here (H.test_ca: openssl, ECDSA P-256) and checking the server's name.
-- The server is spec/fixtures/tls_app.lua (its endpoints are listed
-- there). The browser over HTTPS is in chat_browser_spec.lua.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"
local ffi = require "ffi"     -- kill(2) is declared by spec/helper.lua

local FIXTURE = "tls_app.lua"
-- start(extra, sopts) -> srv, port (H.fixture_servers)
local start_app, cleanup = H.fixture_servers(FIXTURE)
local CURL = "/usr/bin/curl"
local plain = H.plain

-- The text moonport answers a plain HTTP request on an HTTPS port with
-- (src/lx/lx_tls.c).
local PLAIN_REPLY = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n" ..
  "Content-Length: 46\r\nConnection: close\r\n\r\n" ..
  "This port speaks HTTPS: use an https:// URL.\r\n"

-- tls_app.lua on a fresh port with `tls` (a table, sent as JSON) and opts
-- (the fixture's OPTS_JSON); sopts as for H.fixture_servers' start.
local function start(tls, opts, sopts)
  local extra = { cjson.encode(tls) }
  if opts and next(opts) then extra[2] = cjson.encode(opts) end
  return start_app(extra, sopts)
end

-- curl against https://localhost:port (resolved to 127.0.0.1), trusting
-- only `ca`: status, stdout, stderr.
local function curl(ca, port, args, timeout)
  local argv = { CURL, "-sS", "--noproxy", "*", "--max-time", H.T(10), "--cacert", ca.ca,
    "--resolve", "localhost:" .. port .. ":127.0.0.1" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return H.exec(argv, { timeout = timeout })
end

local function url(port, path) return ("https://localhost:%d%s"):format(port, path) end

-- openssl s_client to 127.0.0.1:port with `args`; `input` (optional) is
-- sent, and the client then waits for the server to close (-ign_eof).
-- Returns its status and stdout..stderr.
local function s_client(port, args, input)
  local argv = { H.openssl, "s_client", "-connect", "127.0.0.1:" .. port }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local stdin
  if input then
    stdin = H.tmpdir() .. "/input"
    H.write_file(stdin, input)
    argv[#argv + 1] = "-ign_eof"
  end
  local st, out, err = H.exec(argv, { stdin = stdin, timeout = H.T(10) })
  return st, out .. err
end

-- The subject line s_client printed ("CN = a.test"), or nil.
local function subject(text) return text:match("\nsubject=([^\n]*)") end

local WHO = "GET /who HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"

-- Deterministic bytes of length n (an LCG).
local function bytes(n, seed)
  local t, x = {}, seed or 1
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    t[i] = string.char(math.floor(x / 8388608) % 256)
  end
  return table.concat(t)
end

-- Whether the server at `port` still answers GET /tls over HTTPS.
local function serves(ca, port)
  local st, out = curl(ca, port, { url(port, "/tls") })
  return st == 0 and cjson.decode(out).protocol ~= nil
end

describe("TLS server:", function()
  setup(function()
    for _, tool in ipairs { H.openssl, CURL } do
      assert(H.exists(tool), "no " .. tool .. " (scripts/setup installs it)")
    end
  end)
  after_each(cleanup)

  describe("curl", function()
    it("GET and a POST body over HTTPS, verified against the test CA; req:tls() tells protocol, cipher, SNI, ALPN (TLS 1.3 and 1.2)", function()
      local ca = H.test_ca { "localhost" }
      local srv, port = start(ca.localhost)
      local st, out, err = curl(ca, port, { url(port, "/tls") })
      assert.equal(0, st, err .. srv:describe())
      local t = cjson.decode(out)
      assert.equal("TLSv1.3", t.protocol)
      assert.truthy(t.cipher:match("^TLS_"), t.cipher)
      assert.equal("localhost", t.sni)
      assert.equal("h2", t.alpn) -- curl offers h2 first, and mp.http speaks it
      assert.is_false(t.resumed)
      st, out, err = curl(ca, port, { "--http1.1", url(port, "/tls") })
      assert.equal(0, st, err)
      assert.equal("http/1.1", cjson.decode(out).alpn)

      st, out, err = curl(ca, port, { "--tlsv1.2", "--tls-max", "1.2", url(port, "/tls") })
      assert.equal(0, st, err)
      t = cjson.decode(out)
      assert.equal("TLSv1.2", t.protocol)
      assert.truthy(t.cipher:match("^ECDHE%-ECDSA%-") and t.cipher:match("GCM") or
        t.cipher:match("CHACHA20"), t.cipher)

      local dir = H.tmpdir()
      local body = bytes(300000, 5)
      H.write_file(dir .. "/body", body)
      st, out, err = curl(ca, port, { "--data-binary", "@" .. dir .. "/body",
        "-H", "Content-Type: application/octet-stream", url(port, "/echo") })
      assert.equal(0, st, err)
      assert.equal(#body, #out)
      assert.is_true(out == body, "the echoed body differs")

      -- without the CA, curl refuses the certificate
      local st60, _, err60 = H.exec { CURL, "-sS", "--noproxy", "*", "--max-time", H.T(10),
        "--resolve", "localhost:" .. port .. ":127.0.0.1", url(port, "/tls") }
      assert.equal(60, st60, err60)
      assert.equal(0, srv:stop())
    end)

    it("keeps one connection alive for several requests (curl -v says it re-used it)", function()
      local ca = H.test_ca { "localhost" }
      local _, port = start(ca.localhost)
      local args = { "-v" }
      for _ = 1, 5 do args[#args + 1] = url(port, "/tls") end
      local st, out, err = curl(ca, port, args)
      assert.equal(0, st, err)
      local answers = 0
      for line in out:gmatch('[^\n]*"protocol":"TLSv1%.3"[^\n]*') do
        answers = answers + 1
        assert.is_false(cjson.decode(line).resumed)
      end
      assert.equal(5, answers, out)
      assert.equal(4, H.count_lines(err, "Re-using existing connection"), err)
      assert.equal(1, H.count_lines(err, "SSL connection using TLSv1.3"), err)
    end)

    it("a 3 MiB static file from public= comes through OpenSSL (no kTLS here) byte for byte; the info line says so", function()
      local ca = H.test_ca { "localhost" }
      local pub = H.tmpdir()
      local data = bytes(3 * 1024 * 1024 + 77, 9)
      H.write_file(pub .. "/big.bin", data)
      H.write_file(pub .. "/small.txt", "small\n")
      local srv, port = start(ca.localhost, { public = pub }, { options = { "--log-level", "info" } })
      local out_file = H.tmpdir() .. "/got"
      local st, _, err = curl(ca, port, { "-o", out_file, url(port, "/big.bin") })
      assert.equal(0, st, err)
      local got = assert(H.read_file(out_file))
      assert.equal(#data, #got)
      assert.is_true(got == data, "the file came back different")
      -- a Range of it; a small file, then the big one again, on one connection
      st, _, err = curl(ca, port, { "-o", out_file, "-r", "1000000-1999999", url(port, "/big.bin") })
      assert.equal(0, st, err)
      assert.is_true(H.read_file(out_file) == data:sub(1000001, 2000000), "the range differs")
      st, _, err = curl(ca, port, { "-v", "-o", out_file .. "2", url(port, "/small.txt"),
        "-o", out_file, url(port, "/big.bin") })
      assert.equal(0, st, err)
      assert.equal("small\n", H.read_file(out_file .. "2"))
      assert.is_true(H.read_file(out_file) == data, "the file came back different the second time")
      assert.equal(1, H.count_lines(err, "Re-using existing connection"), err)
      local ulp = H.read_file("/proc/sys/net/ipv4/tcp_available_ulp") or ""
      if not ulp:find("%f[%w]tls%f[%W]") then
        assert.equal(1, H.count_lines(srv:stderr(), "TLS: the kernel offers no kTLS"), srv:stderr())
      end
    end)

    it("an event stream over HTTPS (curl -N) gets each event as it is sent", function()
      local ca = H.test_ca { "localhost" }
      local _, port = start(ca.localhost)
      local argv = { CURL, "-sS", "-N", "--noproxy", "*", "--max-time", tostring(H.T(10)), "--cacert", ca.ca,
        "--resolve", "localhost:" .. port .. ":127.0.0.1", url(port, "/sse") }
      local p = H.spawn(argv)
      p.sanitizer_checked = true
      -- the first event arrives while the stream is open (the second waits for /go)
      H.wait_for(function() return p:stdout():find("data: one\n\n", 1, true) end, H.T(5),
        function() return "the first event: " .. p:stdout() .. p:stderr() end)
      assert.is_true(p:alive())
      assert.falsy(plain(p:stdout(), "two"))
      local st, out, err = curl(ca, port, { url(port, "/go?now") })
      assert.equal(0, st, err)
      assert.equal("went\n", out)
      st = p:wait_exit(H.T(5))
      assert.equal(0, st, p:stderr())
      assert.equal("data: one\n\ndata: two now\n\n", p:stdout())
    end)
  end)

  describe("openssl s_client", function()
    it("TLS 1.3 and 1.2 handshakes work and agree on ALPN http/1.1; TLS 1.1 and 1.0 are refused with a protocol_version alert", function()
      local ca = H.test_ca { "localhost" }
      local _, port = start(ca.localhost)
      local base = { "-servername", "localhost", "-CAfile", ca.ca, "-verify_return_error",
        "-alpn", "http/1.1" } -- (h2 first would get h2: h2_spec)
      for _, v in ipairs { { "-tls1_3", "TLSv1.3" }, { "-tls1_2", "TLSv1.2" } } do
        local args = { v[1] }
        for _, a in ipairs(base) do args[#args + 1] = a end
        local st, text = s_client(port, args, WHO)
        assert.equal(0, st, text)
        assert.truthy(plain(text, "New, " .. v[2] .. ", Cipher is "), text)
        assert.truthy(plain(text, "ALPN protocol: http/1.1"), text)
        assert.truthy(plain(text, "Verify return code: 0 (ok)"), text)
        assert.truthy(text:find("\r\n\r\nwho %d+ %d+\n"), text)
      end
      -- a client that offers only protocols we don't speak goes on without ALPN
      local st, text = s_client(port, { "-servername", "localhost", "-alpn", "spdy/3.1" }, WHO)
      assert.equal(0, st, text)
      assert.truthy(plain(text, "No ALPN negotiated"), text)
      assert.truthy(text:find("\r\n\r\nwho %d+ %d+\n"), text)
      -- SECLEVEL=0 so that the client does offer the old versions
      for _, v in ipairs { "-tls1_1", "-tls1" } do
        st, text = s_client(port, { v, "-cipher", "DEFAULT@SECLEVEL=0", "-servername", "localhost" })
        assert.are_not.equal(0, st, text)
        assert.truthy(plain(text, "alert protocol version") or plain(text, "SSL alert number 70"), v .. ": " .. text)
        assert.truthy(plain(text, "Cipher is (NONE)"), text)
      end
      assert.truthy(serves(ca, port))
    end)

    it("refuses weak TLS 1.2 ciphers (CBC, SHA-1, NULL, no forward secrecy) with a handshake_failure alert, ECDSA and RSA certificates alike", function()
      local ca = H.test_ca { "localhost" }
      local rsa = ca:issue("localhost", { rsa = true, file = "rsa" })
      local _, port = start(ca.localhost)
      local _, rport = start(rsa)
      local function refused(p, cipher)
        local st, text = s_client(p, { "-tls1_2", "-cipher", cipher .. ":@SECLEVEL=0", "-servername", "localhost" })
        assert.are_not.equal(0, st, cipher .. ": " .. text)
        assert.falsy(plain(text, "no cipher match"), cipher .. ": the client does not know it")
        assert.truthy(plain(text, "alert handshake failure") or plain(text, "SSL alert number 40"),
          cipher .. ": " .. text)
      end
      for _, c in ipairs { "ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384", "ECDHE-ECDSA-NULL-SHA" } do
        refused(port, c)
      end
      for _, c in ipairs { "AES128-SHA", "AES256-GCM-SHA384", "ECDHE-RSA-AES128-SHA", "NULL-SHA256" } do
        refused(rport, c)
      end
      -- the same client with a strong cipher works on both
      for _, v in ipairs { { port, "ECDHE-ECDSA-AES256-GCM-SHA384" }, { rport, "ECDHE-RSA-CHACHA20-POLY1305" } } do
        local st, text = s_client(v[1], { "-tls1_2", "-cipher", v[2], "-servername", "localhost",
          "-CAfile", ca.ca, "-verify_return_error" }, WHO)
        assert.equal(0, st, text)
        assert.truthy(plain(text, "Cipher is " .. v[2]), text)
      end
    end)

    it("chain: a certificate from an intermediate CA verifies against the root when the intermediate comes in chain= or after it in cert=; without it, it does not", function()
      local ca = H.test_ca()
      local mid = ca:intermediate("moonport test intermediate")
      local leaf = mid:issue("localhost", { file = "leaf" })
      local both = ca.dir .. "/leaf+mid.pem"
      H.write_file(both, assert(H.read_file(leaf.cert)) .. assert(H.read_file(mid.ca)))
      local confs = {
        ["chain="] = { cert = leaf.cert, key = leaf.key, chain = mid.ca },
        ["cert= with the intermediate after it"] = { cert = both, key = leaf.key },
      }
      for what, conf in pairs(confs) do
        local _, port = start(conf)
        local st, out, err = curl(ca, port, { url(port, "/tls") })
        assert.equal(0, st, what .. ": " .. err)
        assert.equal("TLSv1.3", cjson.decode(out).protocol)
        local text
        st, text = s_client(port, { "-servername", "localhost", "-CAfile", ca.ca, "-verify_return_error",
          "-showcerts" }, WHO)
        assert.equal(0, st, text)
        assert.truthy(plain(text, "Verify return code: 0 (ok)"), text)
        assert.truthy(text:find("\n 1 s:CN = moonport test intermediate", 1, true), what .. ": " .. text)
      end
      local _, port = start({ cert = leaf.cert, key = leaf.key })
      local st, _, err = curl(ca, port, { url(port, "/tls") })
      assert.equal(60, st, "without the intermediate: " .. err)
      -- a chain file with no certificate in it is refused at the start
      local empty = ca.dir .. "/empty.pem"
      H.write_file(empty, "nothing here\n")
      local port2 = H.free_port()
      local code, _, stderr = H.run({ H.fixture(FIXTURE), port2,
        cjson.encode { cert = leaf.cert, key = leaf.key, chain = empty } })
      assert.are_not.equal(0, code)
      local line = H.one_line(stderr)
      assert.truthy(plain(line, "tls: chain " .. empty .. ": no certificate in it"), line)
    end)

    it("SNI: a.test and b.test (and a name under *.b.test) get their certificates; an unknown name or none gets the default", function()
      local ca = H.test_ca { "localhost", "a.test", "b.test" }
      local tls = {
        { cert = ca.localhost.cert, key = ca.localhost.key },
        { cert = ca["a.test"].cert, key = ca["a.test"].key, names = { "a.test" } },
        { cert = ca["b.test"].cert, key = ca["b.test"].key, names = { "b.test", "*.b.test" } },
      }
      local _, port = start(tls)
      local cases = { { "a.test", "CN = a.test" }, { "b.test", "CN = b.test" }, { "x.b.test", "CN = b.test" },
        { "A.TEST", "CN = a.test" }, { "unknown.test", "CN = localhost" }, { "x.y.b.test", "CN = localhost" } }
      for _, c in ipairs(cases) do
        local st, text = s_client(port, { "-servername", c[1] }, WHO)
        assert.equal(0, st, text)
        assert.equal(c[2], subject(text), c[1] .. ": " .. text)
      end
      local st, text = s_client(port, { "-noservername" }, WHO)
      assert.equal(0, st, text)
      assert.equal("CN = localhost", subject(text))
      -- a session is its certificate's: resumed under its own name, a full
      -- handshake (and the other certificate) under another (RFC 6066, 3)
      local GET_TLS = "GET /tls HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
      for _, v in ipairs { "-tls1_3", "-tls1_2" } do
        local sess = H.tmpdir() .. "/session.pem"
        st, text = s_client(port, { v, "-servername", "b.test", "-sess_out", sess }, GET_TLS)
        assert.equal(0, st, text)
        assert.truthy(H.exists(sess), text)
        for _, c in ipairs { { "b.test", "Reused", "CN = b.test", true }, { "localhost", "New", "CN = localhost", false },
            { "a.test", "New", "CN = a.test", false }, { "x.b.test", "Reused", "CN = b.test", true } } do
          st, text = s_client(port, { v, "-servername", c[1], "-sess_in", sess }, GET_TLS)
          assert.equal(0, st, text)
          local what = v .. ", a b.test session offered for " .. c[1]
          assert.truthy(plain(text, "\n" .. c[2] .. ", TLS"), what .. ": " .. text)
          assert.equal(c[3], subject(text), what)
          local t = cjson.decode((assert(text:match("\r\n\r\n(%b{})"), text)))
          assert.equal(c[4], t.resumed, what)
          -- (a resumed TLS 1.2 session keeps the name it was made under:
          -- OpenSSL stores SNI in the 1.2 session)
          assert.equal((v == "-tls1_2" and c[4]) and "b.test" or c[1], t.sni, what .. ": req:tls().sni")
        end
      end
      -- nor under another listener's default certificate (the session id
      -- context is the leaf certificate's digest, not its index)
      local ca2 = H.test_ca { "other.example" }
      local port2 = H.free_port()
      local _, p1 = start({ cert = ca.localhost.cert, key = ca.localhost.key },
        { second = { port = port2, tls = { cert = ca2["other.example"].cert, key = ca2["other.example"].key } } })
      H.wait_for(function() return H.is_listening(port2) end, H.T(10), "the second listener")
      for _, v in ipairs { "-tls1_3", "-tls1_2" } do
        local sess = H.tmpdir() .. "/session.pem"
        st, text = s_client(p1, { v, "-servername", "localhost", "-sess_out", sess }, GET_TLS)
        assert.equal(0, st, text)
        st, text = s_client(p1, { v, "-servername", "localhost", "-sess_in", sess }, GET_TLS)
        assert.equal(0, st, text)
        assert.truthy(plain(text, "\nReused, TLS"), v .. " on its own listener: " .. text)
        st, text = s_client(port2, { v, "-servername", "localhost", "-sess_in", sess }, GET_TLS)
        assert.equal(0, st, text)
        assert.truthy(plain(text, "\nNew, TLS"), v .. ", a session of CN=localhost offered to the other listener: " .. text)
        assert.equal("CN = other.example", subject(text))
      end
      -- curl verifies each name against its own certificate; req:tls().sni
      for _, name in ipairs { "a.test", "b.test", "localhost" } do
        local out, err
        st, out, err = H.exec { CURL, "-sS", "--noproxy", "*", "--max-time", H.T(10), "--cacert", ca.ca,
          "--resolve", name .. ":" .. port .. ":127.0.0.1", ("https://%s:%d/tls"):format(name, port) }
        assert.equal(0, st, name .. ": " .. err)
        assert.equal(name, cjson.decode(out).sni)
      end
    end)
  end)

  describe("Node", function()
    setup(function()
      local why = JS.missing()
      assert(not why, why)
    end)

    it("https: two GETs on one keep-alive socket and a 1 MiB POST, authorized by the test CA; TLS 1.2 too", function()
      local ca = H.test_ca { "localhost" }
      local srv, port = start(ca.localhost)
      local rows = JS.run("tls_cases.js", { port, "https", ca.ca }, 30, srv)
      local get, again = assert(JS.find(rows, "name", "get")), assert(JS.find(rows, "name", "again"))
      for _, r in ipairs { get, again } do
        assert.equal(200, r.status)
        assert.is_true(r.authorized)
        assert.equal("TLSv1.3", r.protocol)
        assert.equal("http/1.1", r.alpn)
        assert.equal("localhost", r.subject)
        assert.equal("moonport test CA", r.issuer)
        assert.equal("TLSv1.3", r.server.protocol)
        assert.equal("http/1.1", r.server.alpn)
      end
      assert.equal(get.localPort, again.localPort, "one connection")
      assert.equal(get.server.pid, again.server.pid)
      local post = assert(JS.find(rows, "name", "post"))
      assert.equal(200, post.status)
      assert.equal(1048576, post.len)
      assert.is_true(post.same)
      local r = JS.run("tls_cases.js", { port, "https12", ca.ca }, 20, srv)[1]
      assert.equal(200, r.status)
      assert.is_true(r.authorized)
      assert.equal("TLSv1.2", r.protocol)
      assert.equal("TLSv1.2", r.server.protocol)
    end)

    it("tls.connect to mp.listen with tls: conn:tls() in on_data (and sock:tls() in on_connect); no ALPN there; a plain listener's conn:tls() and req:tls() are nil", function()
      local ca = H.test_ca { "localhost" }
      local lport, pport, cport = H.free_port(), H.free_port(), H.free_port()
      local srv, port = start(ca.localhost, { listen = lport, plain = pport, connect = cport })
      H.wait_for(function() return srv:listens_on(lport) and srv:listens_on(pport) and srv:listens_on(cport) end, H.T(5))
      local st, text = s_client(cport, { "-servername", "localhost", "-CAfile", ca.ca, "-verify_return_error" }, "hi\n")
      assert.equal(0, st, text)
      local t = cjson.decode((assert(text:match("\n(%b{})"), text)))
      assert.equal("TLSv1.3", t.protocol)
      assert.equal("localhost", t.sni)
      local r = JS.run("tls_cases.js", { lport, "tls", ca.ca, "localhost" }, 20, srv)[1]
      assert.is_true(r.authorized)
      assert.equal("TLSv1.3", r.protocol)
      assert.is_false(r.alpn)
      assert.equal("localhost", r.subject)
      assert.equal("TLSv1.3", r.server.protocol)
      assert.equal("localhost", r.server.sni)
      assert.is_nil(r.server.alpn)
      assert.is_false(r.server.resumed)
      assert.is_nil(r.server.plain)
      -- the name the certificate does not list: Node itself refuses it
      r = JS.run("tls_cases.js", { port, "wrongname", ca.ca, "other.test" }, 20, srv)[1]
      assert.is_false(r.connected)
      assert.equal("ERR_TLS_CERT_ALTNAME_INVALID", r.code)
      -- plain: nil
      local c = H.connect(pport)
      assert.is_true(H.send(c, "GET /tls HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
      text = assert(H.read_to_eof(c, H.T(5)))
      assert.truthy(plain(text, '"plain":true'), text)
      assert.is_true(serves(ca, port))
    end)

    it("the npm ws client over wss:// echoes text and binary up to 1 MiB; ws:tls() seen in on_open", function()
      local ca = H.test_ca { "localhost" }
      local srv, port = start(ca.localhost)
      local rows = JS.run("tls_cases.js", { port, "wss", ca.ca, "/ws" }, 30, srv)
      local open = assert(JS.find(rows, "name", "open"))
      assert.is_true(open.authorized)
      assert.equal("TLSv1.3", open.protocol)
      assert.equal("TLSv1.3", open.server.protocol)
      assert.equal("localhost", open.server.sni)
      for _, name in ipairs { "text", "binary 64 KiB", "binary 1 MiB" } do
        local r = assert(JS.find(rows, "name", name), name)
        assert.is_true(r.same, name)
      end
      assert.equal(1048576, JS.find(rows, "name", "binary 1 MiB").len)
      assert.equal(1000, JS.find(rows, "name", "close").code)
    end)

    it("pipelining: 100 requests and three 2 MiB files in one write, read only after a second (back pressure), answered in order and whole", function()
      local ca = H.test_ca { "localhost" }
      local pub = H.tmpdir()
      local data = bytes(2 * 1024 * 1024 + 13, 21)
      H.write_file(pub .. "/big.bin", data)
      local st, sum = H.exec { "/usr/bin/sha256sum", pub .. "/big.bin" }
      assert.equal(0, st)
      sum = sum:match("^(%x+)")
      local srv, port = start(ca.localhost, { public = pub })
      local r = JS.run("tls_cases.js", { port, "pipeline", ca.ca, 100, "/big.bin" }, 60, srv)[1]
      assert.equal(104, r.answers)
      assert.equal(0, r.rest)
      assert.same({ 200 }, r.statuses)
      assert.equal(101, r.whos)
      assert.same({ sum, sum, sum }, r.bigs)
      assert.same({ 100, 101, 102 }, r.bigAt, "the files' answers in their places")
    end)

    it("200 TLS connections at once: every handshake completes and every one is answered", function()
      local ca = H.test_ca { "localhost" }
      local srv, port = start(ca.localhost)
      local r = JS.run("tls_cases.js", { port, "concurrent", ca.ca, 200 }, 60, srv)[1]
      assert.equal(200, r.handshaken, cjson.encode(r.errors))
      assert.equal(200, r.authorized)
      assert.equal(200, r.answered)
      assert.is_true(srv:alive())
    end)
  end)

  describe("refusals", function()
    it("a plain HTTP request to the TLS port gets the 400 text in plaintext, then the close", function()
      local ca = H.test_ca { "localhost" }
      local _, port = start(ca.localhost)
      for _, req in ipairs { "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi" } do
        local c = H.connect(port)
        assert.is_true(H.send(c, req))
        local t0 = H.now()
        local text, err = H.read_to_eof(c, H.T(3))
        assert.equal(PLAIN_REPLY, text, tostring(err))
        assert.is_true(H.now() - t0 < H.T(1), "closed at once")
      end
      -- curl http:// says the same
      local st, out = H.exec { CURL, "-sS", "--noproxy", "*", "--max-time", H.T(5),
        ("http://127.0.0.1:%d/"):format(port), "-w", "%{http_code}" }
      assert.equal(0, st)
      assert.equal("This port speaks HTTPS: use an https:// URL.\r\n400", out)
      assert.is_true(serves(ca, port))
    end)

    it("garbage instead of a ClientHello is closed at once without a crash; the server goes on serving", function()
      local ca = H.test_ca { "localhost" }
      local srv, port = start(ca.localhost)
      local junk = bytes(2048, 11)
      local cases = {
        ["random bytes"] = "\x80" .. junk:sub(2),
        ["a handshake record of random bytes"] = "\x16\x03\x01\x07\xfb" .. junk:sub(6),
        ["a record longer than TLS allows"] = "\x16\x03\x03\xff\xff" .. junk:sub(6),
        ["an alert record"] = "\x15\x03\x03\x00\x02\x02\x28",
        ["an SSLv2 hello"] = "\x80\x2e\x01\x00\x02\x00\x15" .. junk:sub(1, 100),
        ["zeros"] = ("\0"):rep(2048),
      }
      for name, data in pairs(cases) do
        local c = H.connect(port)
        H.send(c, data)   -- the server may close before it has all of it
        local t0 = H.now()
        local text, err = H.read_to_eof(c, H.T(3))
        assert.truthy(text or err ~= "timeout", name .. ": not closed")
        assert.is_true(H.now() - t0 < H.T(2), name .. ": closed late")
        assert.falsy(text and plain(text, "HTTP/1.1"), name .. ": answered in plaintext")
        c:close()
        assert.is_true(srv:alive(), name .. ": " .. srv:describe())
        assert.is_true(serves(ca, port), name .. ": no longer serving")
      end
      assert.equal(0, srv:stop())
    end)

    it("a client that stops mid-handshake, or trickles it a byte at a time, is cut at header_timeout (0.5 s) while others are served meanwhile", function()
      local ca = H.test_ca { "localhost" }
      local _, port = start(ca.localhost, { header_timeout = 0.5 })
      -- a ClientHello record that says 512 bytes follow, then only 40 of them
      local partial = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" .. bytes(40, 3)
      local stalled, cut = {}, {}
      for i = 1, 3 do
        stalled[i] = H.connect(port)
        if i < 3 then assert.is_true(H.send(stalled[i], partial)) end -- the last sends nothing
      end
      local t0 = H.now()
      -- served meanwhile: complete handshakes and requests
      for _ = 1, 3 do assert.is_true(serves(ca, port)) end
      -- the fourth sends a real-looking hello one byte every 0.1 s, from
      -- its own start (so the handshakes above, however long this machine
      -- takes for them, don't eat its time)
      local trickle = H.connect(port)
      stalled[4] = trickle
      local t4 = H.now()
      local sent, last = 0, 0
      while H.now() - t4 < H.T(4) do
        if not cut[4] and H.now() - last >= 0.1 then
          sent, last = sent + 1, H.now()
          trickle:send(partial:sub(sent, sent))   -- fails once it was cut
        end
        local done = true
        for i, c in ipairs(stalled) do
          if not cut[i] then
            local data, err = H.read_some(c, 0.02)
            if not data and err ~= "timeout" then cut[i] = H.now() - (i == 4 and t4 or t0) end
            assert.falsy(data and plain(data, "HTTP/1.1"), "a plaintext answer: " .. tostring(data))
            done = false
          end
        end
        if done then break end
      end
      for i = 1, 4 do
        assert.truthy(cut[i], ("stalled client %d not cut after %.1f s"):format(i, H.now() - t0))
        assert.is_true(cut[i] >= 0.4, ("client %d cut after %.2f s, before header_timeout"):format(i, cut[i]))
      end
      -- the trickle was watched from its start: cut at header_timeout, not
      -- reprieved by each byte
      assert.is_true(cut[4] < H.T(2.5), ("the trickle was cut after %.2f s"):format(cut[4]))
      assert.is_true(sent >= 2 and sent < #partial, "the trickle went on until the cut: " .. sent)
      assert.is_true(serves(ca, port))
    end)
  end)

  describe("sessions and reloads (-w 2)", function()
    it("a session ticket from one worker resumes on both (s_client -sess_out, then -sess_in: Reused; req:tls().resumed), TLS 1.3 and 1.2; a reload renews the ticket secret", function()
      local ca = H.test_ca { "localhost" }
      local srv, port = start(ca.localhost, nil, { workers = 2 })
      H.wait_for(function() return #H.children(srv:pid()) == 2 end, H.T(10), function() return srv:describe() end)
      local GET_TLS = "GET /tls HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
      -- resumes with the saved session `sess`: the server's view of it
      local function resume(v, sess, what)
        local st, text = s_client(port, { v, "-servername", "localhost", "-sess_in", sess }, GET_TLS)
        assert.equal(0, st, text)
        assert.truthy(plain(text, "\nReused, " .. (v == "-tls1_3" and "TLSv1.3" or "TLSv1.2")),
          v .. " " .. what .. ": not resumed:\n" .. text)
        local t = cjson.decode((assert(text:match("\r\n\r\n(%b{})"), text)))
        assert.is_true(t.resumed, what)
        return t
      end
      local sessions = {}
      for _, v in ipairs { "-tls1_3", "-tls1_2" } do
        local sess = H.tmpdir() .. "/session.pem"
        local st, text = s_client(port, { v, "-servername", "localhost", "-sess_out", sess }, GET_TLS)
        assert.equal(0, st, text)
        assert.truthy(plain(text, "\nNew, "), text)
        assert.is_false(cjson.decode((assert(text:match("\r\n\r\n(%b{})"), text))).resumed)
        assert.truthy(H.exists(sess), "no session saved: " .. text)
        sessions[v] = sess
        local workers, tries = {}, 0
        while (not workers[1] or not workers[2]) and tries < 40 do
          tries = tries + 1
          local t = resume(v, sess, "try " .. tries)
          workers[t.worker] = (workers[t.worker] or 0) + 1
        end
        assert.truthy(workers[1] and workers[2],
          ("%s: resumed %d times, all on one worker: %s"):format(v, tries, cjson.encode(workers)))
      end
      -- a reload: new workers (forked from the same root) take the tickets too
      local before = H.set_of(H.children(srv:pid()))
      assert.equal(0, ffi.C.kill(srv:pid(), H.SIGHUP))
      H.wait_for(function()
        local kids = H.children(srv:pid())
        if #kids ~= 2 then return false end
        for _, k in ipairs(kids) do if before[k] then return false end end
        return true
      end, H.T(15), function() return "two new workers: " .. srv:describe() end)
      -- a reload starts a fresh ticket secret (what a worker's memory gave
      -- away ends there): an old ticket gets a full handshake, a new one
      -- resumes on the new workers
      for v, sess in pairs(sessions) do
        local st, text = s_client(port, { v, "-servername", "localhost", "-sess_in", sess, "-sess_out", sess },
          GET_TLS)
        assert.equal(0, st, text)
        assert.truthy(plain(text, "\nNew, "), v .. ": a ticket from before the reload resumed:\n" .. text)
        for i = 1, 4 do
          local t = resume(v, sess, "after the reload, " .. i)
          assert.is_nil(before[t.pid], "served by an old worker")
        end
      end
    end)

    it("SIGHUP: replaced certificate files serve new connections; a broken one fails the reload with one line naming the file and the old certificate keeps serving", function()
      local ca = H.test_ca()
      local v1 = ca:issue("localhost", { file = "v1", subject = "/CN=localhost/O=v1" })
      local v2 = ca:issue("localhost", { file = "v2", subject = "/CN=localhost/O=v2" })
      local dir = H.tmpdir()
      local live = { cert = dir .. "/server.pem", key = dir .. "/server.key" }
      local function install(c)
        H.write_file(live.cert, assert(H.read_file(c.cert)))
        H.write_file(live.key, assert(H.read_file(c.key)))
      end
      install(v1)
      local fail_if = dir .. "/fail"
      local srv, port = start(live, { fail_if = fail_if }, { workers = 2, options = { "-v" } })
      H.wait_for(function() return #H.children(srv:pid()) == 2 end, H.T(10), function() return srv:describe() end)
      local function seen()
        local st, text = s_client(port, { "-servername", "localhost" }, WHO)
        if st ~= 0 then return nil, text end
        return subject(text), tonumber(text:match("\r\n\r\nwho (%d+) %d+\n"))
      end
      assert.equal("CN = localhost, O = v1", (seen()))

      install(v2)
      assert.equal(0, ffi.C.kill(srv:pid(), H.SIGHUP))
      srv:wait_stderr("SIGHUP: reloaded", H.T(5), true)
      local streak = 0
      H.wait_for(function()
        streak = seen() == "CN = localhost, O = v2" and streak + 1 or 0
        return streak >= 6
      end, H.T(15), function() return "new connections on the v2 certificate: " .. srv:describe() end)
      H.wait_for(function() return #H.children(srv:pid()) == 2 end, H.T(10), function() return srv:describe() end)
      local before = H.children(srv:pid())

      -- broken: the certificate file is not PEM; then a key of another pair
      local broken = {
        { "not a certificate\n", assert(H.read_file(v2.key)), live.cert },
        { assert(H.read_file(v1.cert)), assert(H.read_file(v2.key)), live.key },
      }
      for i, b in ipairs(broken) do
        H.write_file(live.cert, b[1])
        H.write_file(live.key, b[2])
        assert.equal(0, ffi.C.kill(srv:pid(), H.SIGHUP))
        H.wait_for(function() return H.count_lines(srv:stderr(), "reload failed") >= i end, H.T(5),
          function() return "reload " .. i .. " to fail: " .. srv:describe() end)
        H.sleep(0.5)
        local fails = {}
        for _, l in ipairs(H.lines(srv:stderr())) do
          if plain(l, "reload failed") then fails[#fails + 1] = l end
        end
        assert.equal(i, #fails, srv:stderr())
        assert.truthy(plain(fails[i], b[3]), "the line names " .. b[3] .. ": " .. fails[i])
        assert.truthy(plain(fails[i], "tls: "), fails[i])
        assert.same(before, H.children(srv:pid()))
        for k = 1, 6 do
          local sub, pid = seen()
          assert.equal("CN = localhost, O = v2", sub, "connection " .. k .. " after a failed reload")
          assert.truthy(H.set_of(before)[pid])
        end
      end

      -- a good certificate, but the script fails after mp.http: the reload
      -- fails, and a worker forked after it (one killed and replaced, once
      -- the script loads again) still serves v2, the root's certificate,
      -- not the failed reload's
      local v3 = ca:issue("localhost", { file = "v3", subject = "/CN=localhost/O=v3" })
      install(v3)
      H.write_file(fail_if, "")
      assert.equal(0, ffi.C.kill(srv:pid(), H.SIGHUP))
      H.wait_for(function() return H.count_lines(srv:stderr(), "reload failed") >= 3 end, H.T(5),
        function() return "reload 3 to fail: " .. srv:describe() end)
      os.remove(fail_if)
      assert.equal(0, ffi.C.kill(before[1], 9))
      H.wait_for(function()
        local kids = H.children(srv:pid())
        return #kids == 2 and not H.set_of(kids)[before[1]]
      end, H.T(10), function() return "a replacement worker: " .. srv:describe() end)
      local replaced = {}
      for _ = 1, 40 do
        local sub, pid = seen()
        assert.equal("CN = localhost, O = v2", sub, "after a reload that failed late")
        replaced[pid] = true
      end
      local kids = H.children(srv:pid())
      assert.truthy(replaced[kids[1]] and replaced[kids[2]],
        "both workers answered, the replacement too: " .. cjson.encode(kids))
      assert.equal(0, srv:stop())
    end)
  end)
end)
