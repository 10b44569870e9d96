-- Spec: the TLS clients (mp.tcp / mp.connect tls =, mp.fetch https://,
-- mp.websocket wss://, mp.redis rediss:// and --redis rediss://) against
-- moonport's own TLS servers (spec/fixtures/tls_client_app.lua), Node's
-- https with the npm ws server (spec/node/https_peer.js), `openssl
-- s_server` and a redis-server with TLS. The certificates come from a test
-- CA this spec makes with openssl: srv (localhost, 127.0.0.1), wrong (a
-- certificate for wrong.test, same CA), other (a CA that signed nothing).
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local function esc(s)
  return (tostring(s):gsub("[^%w%-_.~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function sh(cmd)
  local ok = os.execute(cmd .. " >/dev/null 2>&1")
  assert(ok == true or ok == 0, "failed: " .. cmd)
end

-- The test CA and the certificates, in dir.
local function make_certs(dir)
  local ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
  sh(("cd %s && openssl req -x509 %s -keyout ca.key -out ca.pem -days 2 -subj /CN=moonport-test-ca"):format(dir, ec))
  sh(("cd %s && openssl req -x509 %s -keyout other.key -out other.pem -days 2 -subj /CN=other-ca"):format(dir, ec))
  for _, c in ipairs { { "srv", "localhost", "DNS:localhost,IP:127.0.0.1" },
                       { "wrong", "wrong.test", "DNS:wrong.test" },
                       { "client", "moonport-client", "DNS:moonport-client" } } do
    local name, cn, san = c[1], c[2], c[3]
    local f = assert(io.open(dir .. "/" .. name .. ".ext", "w"))
    f:write("subjectAltName=" .. san .. "\n")
    f:close()
    sh(("cd %s && openssl req %s -keyout %s.key -out %s.csr -subj /CN=%s"):format(dir, ec, name, name, cn))
    sh(("cd %s && openssl x509 -req -in %s.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out %s.pem -days 2 -extfile %s.ext")
      :format(dir, name, name, name))
  end
end

local function get(port, target) return H.get_json(port, target, H.T(20)) end

describe("TLS clients", function()
  local dir, app, port, ports, node, nport
  local function run(case, q)
    local parts = { "/run?case=" .. case }
    for k, v in pairs(q or {}) do parts[#parts + 1] = k .. "=" .. esc(v) end
    local ok, r = pcall(get, port, table.concat(parts, "&"))
    if not ok then error(tostring(r) .. "\n" .. app:describe(), 0) end
    return r
  end
  local function mine(path) return "https://127.0.0.1:" .. ports.https .. path end
  local function theirs(path) return "https://localhost:" .. nport .. path end

  setup(function()
    local why = JS.missing()
    assert(not why, why)
    dir = H.tmpdir()
    make_certs(dir)
    node = H.spawn({ JS.node, JS.dir .. "/https_peer.js", dir .. "/srv.pem", dir .. "/srv.key" })
    nport = cjson.decode(node:wait_stdout("{[^\n]*}", H.T(10))).port
    port = H.free_port()
    app = H.start("tls_client_app.lua", { args = { port, dir }, wait_port = port })
    ports = get(port, "/ports")
  end)
  teardown(function()
    if app then assert.equal(0, app:stop()) end
    H.cleanup()
  end)

  describe("mp.tcp", function()
    it("echoes bytes over TLS 1.3, small and 1 MB, verified against a given CA", function()
      local r = run("tcp_echo", { n = 5, tls = "ca" })
      assert.same({ 5, true, "TLSv1.3" }, { r.n, r.same, r.protocol }, cjson.encode(r))
      assert.truthy(r.cipher:match("^TLS_"))
      r = run("tcp_echo", { n = 1048576, tls = "ca" })
      assert.same({ 1048576, true }, { r.n, r.same }, cjson.encode(r))
      r = run("tcp_echo", { n = 300, tls = "ca", host = "localhost" }) -- a name, looked up
      assert.same({ 300, true }, { r.n, r.same }, cjson.encode(r))
      -- many small sends in one loop iteration (records batched), then a
      -- large one (past the batch): the records stay in order
      r = run("tcp_echo", { n = 70000, step = 7, small = 700, tls = "ca" })
      assert.same({ 70000, true }, { r.n, r.same }, cjson.encode(r))
    end)

    it("talks to openssl s_server (a peer we did not write)", function()
      local sport = H.free_port()
      H.spawn({ "/usr/bin/openssl", "s_server", "-quiet", "-rev", "-accept", "127.0.0.1:" .. sport,
                "-cert", dir .. "/srv.pem", "-key", dir .. "/srv.key" })
      H.wait_for(function() return H.is_listening(sport) end, H.T(10), "openssl s_server")
      local r = run("tcp_line", { port = sport, tls = "ca", line = "hello moonport" })
      assert.equal("tropnoom olleh", r.line, cjson.encode(r))
    end)

    it("sends a client certificate (cert, key) to a server that asks for one", function()
      local sport = H.free_port()
      H.spawn({ "/usr/bin/openssl", "s_server", "-quiet", "-rev", "-accept", "127.0.0.1:" .. sport,
                "-cert", dir .. "/srv.pem", "-key", dir .. "/srv.key",
                "-Verify", "1", "-verify_return_error", "-CAfile", dir .. "/ca.pem" })
      H.wait_for(function() return H.is_listening(sport) end, H.T(10), "openssl s_server -Verify")
      local r = run("tcp_line", { port = sport, tls = "client", line = "with a certificate" })
      assert.equal("etacifitrec a htiw", r.line, cjson.encode(r))
      -- without one: the server refuses (in TLS 1.3 after the client's
      -- handshake, so the read fails with the server's alert)
      r = run("tcp_line", { port = sport, tls = "ca", line = "without" })
      assert.is_nil(r.line)
      assert.truthy(r.err and r.err:match("certificate required"), cjson.encode(r))
    end)

    it("fails verification with nil, err naming the reason", function()
      -- a certificate for another name
      local r = run("tcp_echo", { n = 5, tls = "ca", port = ports.wecho })
      assert.truthy(r.err and r.err:match("certificate verify failed: IP address mismatch"), r.err)
      r = run("tcp_echo", { n = 5, tls = "ca", port = ports.wecho, host = "localhost" })
      assert.truthy(r.err and r.err:match("hostname mismatch"), r.err)
      -- an issuer not trusted: another CA, or the system's store
      r = run("tcp_echo", { n = 5, tls = "other" })
      assert.truthy(r.err and r.err:match("certificate verify failed"), r.err)
      r = run("tcp_echo", { n = 5, tls = "system" })
      assert.truthy(r.err and r.err:match("certificate verify failed: unable to get local issuer"), r.err)
      -- verify = false, or the certificate's own name given as sni, connect
      r = run("tcp_echo", { n = 7, tls = "noverify" })
      assert.same({ 7, true }, { r.n, r.same }, cjson.encode(r))
      r = run("tcp_echo", { n = 7, tls = "noverify", port = ports.wecho })
      assert.same({ 7, true }, { r.n, r.same }, cjson.encode(r))
      r = run("tcp_echo", { n = 7, tls = "sni", sni = "wrong.test", port = ports.wecho })
      assert.same({ 7, true }, { r.n, r.same }, cjson.encode(r))
      -- the name is checked, not just the chain: the right CA, a wrong sni
      r = run("tcp_echo", { n = 7, tls = "sni", sni = "other.test" })
      assert.truthy(r.err and r.err:match("hostname mismatch"), r.err)
    end)

    it("a handshake that stalls ends at the connect timeout", function()
      local t0 = H.now()
      local r = run("tcp_echo", { n = 5, tls = "ca", port = ports.silent, timeout = 500 })
      assert.equal("timeout", r.err)
      assert.truthy(H.now() - t0 < H.T(3))
      r = run("connect", { tls = "ca", port = ports.silent, ct = 0.5 })
      assert.same({ "fail timeout" }, r.events)
    end)

    it("pools a TLS connection only for the same settings and name, never for a plain socket", function()
      local r = run("pool")
      assert.same({
        first = "0 true", plain = "0 false no echo: nil", same = "1 true", noverify = "0 true",
        sni = "0 true", same2 = "2 true",
      }, r)
    end)
  end)

  describe("mp.connect", function()
    it("opens over TLS (a name looked up and verified) and echoes", function()
      local r = run("connect", { tls = "ca", host = "localhost" })
      assert.same({ "open", "data hi there", "close local" }, r.events)
    end)
    it("on_fail names the TLS reason", function()
      local r = run("connect", { tls = "ca", port = ports.wecho })
      assert.same({ "fail certificate verify failed: IP address mismatch" }, r.events)
      r = run("connect", { tls = "other" })
      assert.equal(1, #r.events)
      assert.truthy(r.events[1]:match("^fail certificate verify failed"), r.events[1])
    end)
  end)

  describe("mp.fetch https://", function()
    it("GET and POST against moonport's HTTPS server", function()
      local r = run("fetch", { url = mine("/hello"), tls = "ca" })
      assert.same({ 200, "hello from moonport https", "text/plain" }, { r.status, r.body, r.ctype })
      r = run("fetch", { url = mine("/echo"), tls = "ca", method = "POST", body = "payload over tls" })
      assert.equal(200, r.status, cjson.encode(r))
      local e = cjson.decode(r.body)
      assert.same({ "POST", "payload over tls", "127.0.0.1:" .. ports.https }, { e.method, e.body, e.host })
      r = run("fetch", { url = mine("/echo"), tls = "ca", method = "POST", pieces = 1 })
      assert.equal(200, r.status, cjson.encode(r))
      assert.equal("one,two,three", cjson.decode(r.body).body)
    end)

    it("GET and POST against Node's https (a peer we did not write), by name", function()
      local r = run("fetch", { url = theirs("/hello"), tls = "ca" })
      assert.same({ 200, "hello from node https" }, { r.status, r.body })
      local big = ("0123456789"):rep(20000)
      r = run("fetch", { url = theirs("/echo"), tls = "ca", method = "POST", big = #big })
      local e = cjson.decode(r.body)
      assert.same({ "POST", 200000, "localhost:" .. nport }, { e.method, e.length, e.host })
      assert.is_true(e.body == big)
    end)

    it("follows redirects https -> https (to another server), and https -> http with allow_downgrade only", function()
      local r = run("fetch", { url = mine("/to?url=" .. esc(theirs("/hello"))), tls = "ca", follow = 2 })
      assert.same({ 200, "hello from node https", theirs("/hello") }, { r.status, r.body, r.url })
      r = run("fetch", { url = theirs("/to?url=" .. esc(mine("/hello"))), tls = "ca", follow = 2 })
      assert.same({ 200, "hello from moonport https" }, { r.status, r.body })
      -- https -> http only when asked (the rest would go in the clear)
      local plain = "http://127.0.0.1:" .. port .. "/ports"
      r = run("fetch", { url = mine("/to?url=" .. esc(plain)), tls = "ca", follow = 1 })
      assert.equal("redirect from https to http refused (allow_downgrade = true follows it)", r.err)
      r = run("fetch", { url = mine("/to?url=" .. esc(plain)), tls = "ca", follow = 1, downgrade = 1 })
      assert.same({ 200, ports.https }, { r.status, cjson.decode(r.body).https })
      -- and without follow, the 302 itself
      r = run("fetch", { url = mine("/to?url=" .. esc(plain)), tls = "ca" })
      assert.equal(302, r.status)
    end)

    it("a wrong name, an unknown CA, the system store: nil, err naming the reason", function()
      local r = run("fetch", { url = "https://127.0.0.1:" .. ports.wrong .. "/hello", tls = "ca" })
      assert.equal("certificate verify failed: IP address mismatch", r.err)
      r = run("fetch", { url = "https://localhost:" .. ports.wrong .. "/hello", tls = "ca" })
      assert.equal("certificate verify failed: hostname mismatch", r.err)
      r = run("fetch", { url = mine("/hello"), tls = "other" })
      assert.truthy(r.err and r.err:match("^certificate verify failed"), r.err)
      r = run("fetch", { url = mine("/hello") }) -- the default: the system's store
      assert.truthy(r.err and r.err:match("^certificate verify failed: unable to get local issuer"), r.err)
      -- a redirect to a server with the wrong name fails the same way
      r = run("fetch", { url = mine("/to?url=" .. esc("https://localhost:" .. ports.wrong .. "/hello")),
                         tls = "ca", follow = 1 })
      assert.equal("certificate verify failed: hostname mismatch", r.err)
    end)

    it("verify = false talks to any certificate", function()
      local r = run("fetch", { url = "https://127.0.0.1:" .. ports.wrong .. "/hello", tls = "noverify" })
      assert.same({ 200, "hello from moonport https" }, { r.status, r.body })
    end)

    it("an https URL to a plain HTTP port fails, it is never sent in the clear", function()
      local r = run("fetch", { url = "https://127.0.0.1:" .. port .. "/ports", tls = "ca" })
      assert.is_nil(r.status)
      assert.is_string(r.err)
    end)
  end)

  describe("mp.websocket wss://", function()
    it("echoes against moonport's own wss endpoint", function()
      local r = run("ws", { url = "wss://127.0.0.1:" .. ports.https .. "/ws", tls = "ca", n = 300000 })
      assert.same({ "hello over tls", true, true, false, 300000 },
                  { r.first, r.first_text, r.second_same, r.second_text, r.n }, cjson.encode(r))
    end)
    it("echoes against the npm ws server over Node's https", function()
      local r = run("ws", { url = "wss://localhost:" .. nport .. "/echo", tls = "ca", n = 70000 })
      assert.same({ "hello over tls", true, true, false, 70000 },
                  { r.first, r.first_text, r.second_same, r.second_text, r.n }, cjson.encode(r))
    end)
    it("a wrong name fails the handshake with the reason", function()
      local r = run("ws", { url = "wss://localhost:" .. ports.wrong .. "/ws", tls = "ca" })
      assert.equal("certificate verify failed: hostname mismatch", r.err)
      r = run("ws_error", { url = "wss://127.0.0.1:" .. ports.https .. "/ws" }) -- system store
      assert.truthy(r.result:match("^error certificate verify failed"), r.result)
      r = run("ws_error", { url = "wss://127.0.0.1:" .. ports.https .. "/ws", tls = "ca" })
      assert.equal("open", r.result)
    end)
  end)

  describe("rediss://", function()
    local rport, redis
    local function redis_argv()
      return { "/usr/bin/redis-server", "--port", "0", "--tls-port", tostring(rport),
        "--bind", "127.0.0.1", "--tls-cert-file", dir .. "/srv.pem", "--tls-key-file", dir .. "/srv.key",
        "--tls-ca-cert-file", dir .. "/ca.pem", "--tls-auth-clients", "no", "--save", "",
        "--appendonly", "no", "--dir", dir, "--loglevel", "warning" }
    end
    -- redis-cli over TLS: its answer (first line)
    local function cli(...)
      local args = { "redis-cli", "--tls", "--cacert", dir .. "/ca.pem", "-h", "127.0.0.1", "-p", tostring(rport) }
      for _, a in ipairs { ... } do args[#args + 1] = "'" .. a .. "'" end
      local f = io.popen(table.concat(args, " ") .. " 2>&1")
      local out = f:read("*a")
      f:close()
      return (out:gsub("\n$", ""))
    end
    local function start_redis()
      redis = H.spawn(redis_argv())
      H.wait_for(function()
        if not redis:alive() then error("redis-server exited: " .. redis:describe(), 0) end
        return cli("PING") == "PONG"
      end, H.T(10), "redis-server with TLS")
    end
    local function url(q) return "rediss://127.0.0.1:" .. rport .. "/" .. (q or "?ca=" .. dir .. "/ca.pem") end

    before_each(function()
      if not redis or not redis:alive() then
        rport = rport or H.free_port()
        start_redis()
      end
    end)

    it("mp.redis: PING, SET, GET over TLS (the value seen by redis-cli too)", function()
      local v = "v" .. math.random(1e9)
      local r = run("redis", { url = url(), value = v })
      assert.same({ { "PONG" }, { "OK" }, { v }, true }, { r.ping, r.set, r.get, r.connected }, cjson.encode(r))
      assert.equal(v, cli("GET", "tls:key"))
      -- by name: the name (not the address it resolves to) is verified
      r = run("redis", { url = "rediss://localhost:" .. rport .. "?ca=" .. dir .. "/ca.pem", value = v .. "2" })
      assert.same({ "OK" }, r.set, cjson.encode(r))
      assert.equal(v .. "2", cli("GET", "tls:key"))
      -- verify=0 against the system store's refusal
      r = run("redis", { url = url("?verify=0"), value = v .. "3" })
      assert.same({ "PONG" }, r.ping, cjson.encode(r))
    end)

    it("mp.redis: 3 MB there and back, and 2000 commands in flight at once", function()
      local r = run("redis_big", { url = url(), n = 3000000, m = 2000 })
      assert.same({ { "OK" }, true, 3000000, 2000, 0 }, { r.set, r.same, r.n, r.pipelined, r.bad },
                  cjson.encode(r))
      assert.equal("3000000", cli("STRLEN", "tls:big"))
    end)

    it("mp.redis: verification failures name the reason", function()
      local r = run("redis", { url = url("?ca=" .. dir .. "/ca.pem&sni=wrong.test"), value = "x" })
      assert.same({ cjson.null, "connection lost: certificate verify failed: hostname mismatch" },
                  r.ping, cjson.encode(r))
      assert.same({ cjson.null, "not connected" }, r.set) -- until a retry connects
      r = run("redis", { url = url("?ca=" .. dir .. "/other.pem"), value = "x" })
      assert.truthy(r.ping[2]:match("^connection lost: certificate verify failed"), r.ping[2])
      r = run("redis", { url = url(""), value = "x" }) -- the system's store
      assert.truthy(r.ping[2]:match("^connection lost: certificate verify failed"), r.ping[2])
      assert.equal(false, r.connected)
      -- a bad URL or a file that doesn't load raises at once
      local c = H.connect(port)
      H.send(c, "GET /run?case=redis&url=" .. esc(url("?ca=" .. dir .. "/nope.pem")) ..
                " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      local data = H.read_to_eof(c, H.T(10))
      c:close()
      assert.truthy(data:match("^HTTP/1%.1 500"), data)
    end)

    it("--redis rediss://: publishes from mp.on(\"stop\") reach Redis, the root lane's too", function()
      -- The TLS connection to Redis outlives the shutdown's start: what the
      -- stop handlers publish goes out before it closes.
      local ch = "bye" .. math.random(1e9)
      local sub = H.spawn { "/usr/bin/redis-cli", "--tls", "--cacert", dir .. "/ca.pem", "-h", "127.0.0.1",
        "-p", tostring(rport), "SUBSCRIBE", ch }
      H.wait_for(function() return cli("PUBSUB", "NUMSUB", ch):match("\n(%d+)$") == "1" end,
                 H.T(10), "redis-cli's subscription")
      local p = H.free_port()
      local srv = H.start("pubsub_node.lua", { args = { p }, wait_port = p,
        options = { "-w", "2", "--redis", url() }, env = { PUBSUB_NODE_STOP_PUB = ch } })
      local want = 1 + 2 * srv.threads -- the root's lane and every worker lane
      H.wait_for(function() return #srv:stdout_lines("^ready ") >= want end, H.T(10),
                 function() return "ready: " .. srv:describe() end)
      local function stops(pat)
        local n = 0
        for _, l in ipairs(H.lines(sub:stdout())) do
          if l:match(pat) then n = n + 1 end
        end
        return n
      end
      -- the server's link to Redis is up (a publish before it is, queued
      -- for the connect, is not this case's): one publish goes through
      local c = H.connect(p)
      H.send(c, "pub - " .. ch .. " hello\n")
      assert.equal("ok pub", H.read_line(c))
      c:close()
      H.wait_for(function() return stops("^hello$") == 1 end, H.T(10),
                 function() return "the first publish: " .. sub:stdout() .. "\n" .. srv:describe() end)
      assert.equal(0, srv:stop())
      local got
      H.wait_for(function()
        got = stops("^stop ")
        return got >= want
      end, H.T(10), function()
        return ("%d of %d publishes from stop handlers: %s\n%s"):format(got, want, sub:stdout(), srv:describe())
      end)
      assert.equal(1, stops("^stop root "), sub:stdout())
      assert.equal(want, got, sub:stdout())
      sub:kill(H.SIGKILL)
    end)

    it("--redis rediss://: pub/sub between two servers, redis-cli's publishes, and a Redis restart", function()
      local function start_node()
        local p = H.free_port()
        local srv = H.start("pubsub_node.lua", { args = { p, "a:-:news" }, wait_port = p, threads = 1,
          options = { "--redis", url() } })
        H.wait_for(function() return #srv:stdout_lines("^ready ") >= 1 end, H.T(10),
                   function() return "ready: " .. srv:describe() end)
        return srv, p
      end
      local s1, p1 = start_node()
      local s2 = start_node()
      -- both subscribed in Redis
      H.wait_for(function() return cli("PUBSUB", "NUMSUB", "news"):match("news\n(%d+)") == "2" end,
                 H.T(10), "two subscribers of news")
      local function delivered(srv, msg)
        return #srv:stdout_lines("^S a .* ch=news msg=" .. msg:gsub("%-", "%%-") .. "$") == 1
      end
      local c = H.connect(p1)
      H.send(c, "pub - news hello-over-tls\n")
      assert.equal("ok pub", H.read_line(c))
      H.wait_for(function() return delivered(s1, "hello-over-tls") and delivered(s2, "hello-over-tls") end,
                 H.T(10), function() return s1:stdout() .. s2:stdout() end)
      assert.equal("2", cli("PUBLISH", "news", "from-cli"))
      H.wait_for(function() return delivered(s1, "from-cli") and delivered(s2, "from-cli") end,
                 H.T(10), function() return s1:stdout() .. s2:stdout() end)
      -- Redis goes away and comes back: both reconnect and subscribe again
      redis:kill(H.SIGKILL)
      H.wait_for(function() return not redis:alive() end, H.T(5), "redis-server to die")
      start_redis()
      H.wait_for(function() return cli("PUBSUB", "NUMSUB", "news"):match("news\n(%d+)") == "2" end,
                 H.T(15), function() return "resubscribed: " .. s1:stderr() end)
      H.send(c, "pub - news after-restart\n")
      assert.equal("ok pub", H.read_line(c))
      H.wait_for(function() return delivered(s1, "after-restart") and delivered(s2, "after-restart") end,
                 H.T(10), function() return s1:stdout() .. s2:stdout() end)
      c:close()
      -- the restart was logged with its reason; a clean stop adds no error
      local lost = H.count_lines(s1:stderr(), "lost the connection to")
      assert.truthy(lost >= 1, s1:stderr())
      assert.equal(0, s1:stop())
      assert.equal(0, s2:stop())
      assert.equal(lost, H.count_lines(s1:stderr(), "lost the connection to"), s1:stderr())
    end)
  end)
end)
