-- mp.upstream through the real binary (spec/fixtures/upstream_app.lua) in
-- front of upstreams we did not write: Node `http` servers
-- (spec/node/proxy_upstream.js), `python3 -m http.server`, nginx and the
-- npm `ws` server; clients: curl, Node's http Agent (spec/node/proxy_load.js)
-- and npm `ws`.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"
local lfs = require "lfs"

local function node_up(id)
  local p = H.spawn({ JS.node, JS.dir .. "/proxy_upstream.js", id })
  p.sanitizer_checked = true
  p.port = cjson.decode(p:wait_stdout("{[^\n]*}", H.T(10))).port
  return p
end

local function curl(args)
  local p = assert(io.popen("/usr/bin/curl -s --max-time " .. math.ceil(H.T(60)) ..
    " -w '\\n%{http_code}' " .. args .. " 2>/dev/null"))
  local out = p:read("*a")
  p:close()
  local body, code = out:match("^(.*)\n(%d+)$")
  return tonumber(code), body
end

local function curl_head(args)
  local p = assert(io.popen("/usr/bin/curl -s -D - -o /dev/null --max-time " ..
    math.ceil(H.T(20)) .. " " .. args))
  local out = p:read("*a")
  p:close()
  return out
end

local function load(port, path, n, c, extra)
  local args = { port, path, n, c, "GET" }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  local rows = JS.exec("proxy_load.js", args, 120)
  assert.truthy(rows[1], "proxy_load.js printed nothing")
  return rows[1]
end

describe("mp.upstream", function()
  local ups, app, port, sport
  local start, cleanup = H.fixture_servers("upstream_app.lua")

  local function csv()
    local t = {}
    for i, u in ipairs(ups) do t[i] = u.port end
    return table.concat(t, ",")
  end

  local wsrv
  setup(function()
    ups = { node_up("a"), node_up("b"), node_up("c") }
    wsrv = H.spawn({ JS.node, JS.dir .. "/ws_server.js" })
    wsrv.sanitizer_checked = true
    local wport = cjson.decode(wsrv:wait_stdout("{[^\n]*}", H.T(10))).port
    sport = H.free_port()
    app, port = start({ sport, csv(), "1,2,3", 0, wport }, { threads = 2 })
    H.wait_for(function() return app:listens_on(sport) end, H.T(10), "stream port")
  end)
  teardown(function()
    for _, u in ipairs(ups) do if u:alive() then u:kill(H.SIGKILL) end end
    if wsrv:alive() then wsrv:kill(H.SIGKILL) end
    cleanup()
  end)

  it("splices a WebSocket: npm ws echoes through the proxy to an npm ws server", function()
    local rows = JS.run("proxy_ws.js", { port }, 30, app)
    assert.same({ echoed = 203, bytes = 5 + 256 + 1048576 + 690 }, rows[1])
    assert.same({ closed = 4000 }, rows[2])
    -- the tunnel is gone with the close, and the proxy still serves
    assert.equal(200, (curl(("'http://127.0.0.1:%d/id'"):format(port))))
  end)

  it("round_robin shares by weight within 5 % (1:2:3 over 600 requests, 2 lanes)", function()
    local r = load(port, "/id", 600, 12)
    assert.same({ ["200"] = 600 }, r.status)
    -- within 5 % of each server's own share (smooth weighted round robin
    -- strays by less than one request per lane from any window's share)
    assert.is_true(math.abs((r.bodies.a or 0) - 100) <= 5, cjson.encode(r.bodies))
    assert.is_true(math.abs((r.bodies.b or 0) - 200) <= 10, cjson.encode(r.bodies))
    assert.is_true(math.abs((r.bodies.c or 0) - 300) <= 15, cjson.encode(r.bodies))
  end)

  it("least_conn and ewma reach every server and answer all", function()
    for _, which in ipairs { "least", "ewma" } do
      local r = load(port, "/id", 300, 6, { "x-up=" .. which })
      assert.same({ ["200"] = 300 }, r.status)
      for _, id in ipairs { "a", "b", "c" } do
        assert.is_true((r.bodies[id] or 0) > 0, which .. ": " .. cjson.encode(r.bodies))
      end
    end
  end)

  it("drops hop-by-hop fields and the ones Connection names, both ways; sets X-Forwarded-* and Forwarded", function()
    local code, body = curl(("-H 'Connection: keep-alive, X-Private' -H 'X-Private: s' " ..
      "-H 'Keep-Alive: 5' -H 'TE: trailers' -H 'Proxy-Connection: x' -H 'Upgrade: h2c' " ..
      "-H 'X-Forwarded-For: 10.9.8.7' -H 'Forwarded: for=10.9.8.7' -H 'X-Other: o' " ..
      "'http://127.0.0.1:%d/echo?q=1'"):format(port))
    assert.equal(200, code)
    local e = cjson.decode(body)
    local h = e.headers
    for _, gone in ipairs { "connection", "x-private", "keep-alive", "te", "proxy-connection", "upgrade" } do
      assert.is_nil(h[gone], gone .. " passed: " .. body)
    end
    assert.equal("o", h["x-other"])
    assert.equal("10.9.8.7, 127.0.0.1", h["x-forwarded-for"])
    assert.equal("http", h["x-forwarded-proto"])
    assert.equal("127.0.0.1:" .. port, h["x-forwarded-host"])
    assert.equal('for=10.9.8.7, for=127.0.0.1;proto=http;host="127.0.0.1:' .. port .. '"', h.forwarded)
    assert.equal("/echo?q=1", e.url)
    local head = curl_head(("'http://127.0.0.1:%d/hop'"):format(port)):lower()
    assert.truthy(head:find("x-kept: yes", 1, true), head)
    for _, gone in ipairs { "x-secret", "keep-alive:", "proxy-connection", "trailer" } do
      assert.falsy(head:find(gone, 1, true), gone .. " passed: " .. head)
    end
  end)

  it("up:proxy options: path, headers added and replaced, strip, host = upstream", function()
    local code, body = curl(("-H 'X-Replaced: old' -H 'X-Strip-Me: 1' 'http://127.0.0.1:%d/opt/echo?z=2'"):format(port))
    assert.equal(200, code)
    local e = cjson.decode(body)
    assert.equal("/echo?z=2", e.url)
    assert.equal("1", e.headers["x-added"])
    assert.equal("new", e.headers["x-replaced"])
    assert.is_nil(e.headers["x-strip-me"])
    assert.truthy(e.headers.host:match("^127%.0%.0%.1:%d+$"))
    assert.are_not.equal("127.0.0.1:" .. port, e.headers.host)
  end)

  it("passes a buffered and a streamed (chunked) request body", function()
    local code, body = curl(("-d 'a=1&b=2' 'http://127.0.0.1:%d/echo'"):format(port))
    assert.equal(200, code)
    assert.equal("a=1&b=2", cjson.decode(body).body)
    code, body = curl(("-H 'Transfer-Encoding: chunked' --data-binary 'streamed body' 'http://127.0.0.1:%d/echo'"):format(sport))
    assert.equal(200, code)
    local e = cjson.decode(body)
    assert.equal("streamed body", e.body)
    assert.equal("chunked", e.headers["transfer-encoding"])
  end)

  it("a consistent-hash key keeps its server when a server is added", function()
    local function owners()
      local t = {}
      for i = 1, 150 do
        local code, body = curl(("-H 'X-Up: hash' -H 'X-User: user%d' 'http://127.0.0.1:%d/id'"):format(i, port))
        assert.equal(200, code)
        t[i] = body
      end
      return t
    end
    local before = owners()
    local again = owners()
    assert.same(before, again)
    local d = node_up("d")
    ups[#ups + 1] = d
    assert.equal(200, (curl(("'http://127.0.0.1:%d/_set?ports=%s'"):format(port, csv()))))
    local after = owners()
    local moved, to_d = 0, 0
    for i = 1, 150 do
      if after[i] ~= before[i] then
        moved = moved + 1
        assert.equal("d", after[i], "user" .. i .. " moved between old servers")
        to_d = to_d + 1
      end
    end
    assert.is_true(to_d > 10 and moved < 75, "moved " .. moved)
    table.remove(ups)
    d:kill(H.SIGKILL)
    assert.equal(200, (curl(("'http://127.0.0.1:%d/_set?ports=%s'"):format(port, csv()))))
  end)

  it("a POST is never retried once its body was sent; a GET is", function()
    local function dies()
      local n = 0
      for _, u in ipairs(ups) do
        local _, body = curl(("'http://127.0.0.1:%d/hits'"):format(u.port))
        n = n + cjson.decode(body).die
      end
      return n
    end
    local d0 = dies()
    local code, body = curl(("-H 'X-Up: nofail' -d 'x=1' 'http://127.0.0.1:%d/die'"):format(port))
    assert.equal(502, code)
    assert.truthy(body:find("after the request was sent", 1, true), body)
    assert.equal(d0 + 1, dies())
    code = curl(("-H 'X-Up: nofail' -H 'Transfer-Encoding: chunked' --data-binary 'y' 'http://127.0.0.1:%d/die'"):format(sport))
    assert.equal(502, code)
    assert.equal(d0 + 2, dies())
    code = curl(("-H 'X-Up: nofail' 'http://127.0.0.1:%d/die'"):format(port))
    assert.equal(502, code)
    assert.is_true(dies() >= d0 + 2 + 3, "a GET is tried on each of the three")
  end)

  it("a server given by name is looked up on the lane's resolver", function()
    local code, body = curl(("-H 'X-Up: named' 'http://127.0.0.1:%d/id'"):format(port))
    assert.equal(200, code)
    assert.equal("a", body)
  end)

  it("a streamed PUT is not sent twice, idempotent or not", function()
    local function dies()
      local n = 0
      for _, u in ipairs(ups) do
        local _, body = curl(("'http://127.0.0.1:%d/hits'"):format(u.port))
        n = n + cjson.decode(body).die
      end
      return n
    end
    local d0 = dies()
    local code = curl(("-X PUT -H 'X-Up: nofail' -H 'Transfer-Encoding: chunked' --data-binary 'z' 'http://127.0.0.1:%d/die'"):format(sport))
    assert.equal(502, code)
    assert.equal(d0 + 1, dies())
  end)

  it("an upstream head past 64 KiB is a 502, and the proxy goes on", function()
    local code, body = curl(("-H 'X-Up: one' 'http://127.0.0.1:%d/bighead'"):format(port))
    assert.equal(502, code)
    assert.truthy(body:find("bad response", 1, true), body)
    assert.equal(200, (curl(("'http://127.0.0.1:%d/id'"):format(port))))
  end)

  it("504 with a clear body when the upstream is too slow", function()
    local code, body = curl(("-H 'X-Up: one' 'http://127.0.0.1:%d/slow?ms=%d'"):format(port, 3000))
    assert.equal(504, code)
    assert.truthy(body:find("Gateway Timeout", 1, true), body)
  end)

  it("a big upload and download through the proxy with both sides slow, the worker's RSS flat", function()
    local size = H.sanitized and 64 * 1024 * 1024 or 1024 * 1024 * 1024
    local rss0 = assert(app:rss_kb())
    local max_rss = rss0
    local function sample()
      local r = app:rss_kb() or 0
      if r > max_rss then max_rss = r end
    end
    -- upload: chunked from a pipe, the upstream pausing 1 ms every 32 reads
    local out = H.tmpdir() .. "/up.json"
    local p = H.spawn({ "/bin/sh", "-c", ("head -c %d /dev/zero | tr '\\0' 'z' | /usr/bin/curl -s -T - " ..
      "-H 'Content-Type: application/octet-stream' 'http://127.0.0.1:%d/upload?ms=1&every=32' -o %s"):format(size, sport, out) })
    p.sanitizer_checked = true
    H.wait_for(function() sample(); return not p:alive() end, H.T(240), "the upload", 0.2)
    local r = cjson.decode((assert(H.read_file(out))))
    assert.equal(size, r.bytes)
    local m = io.popen(("head -c %d /dev/zero | tr '\\0' 'z' | md5sum"):format(size))
    assert.equal(m:read("*a"):match("^(%x+)"), r.md5)
    m:close()
    -- download: the upstream pausing 1 ms every 32 x 64 KiB, the client reading
    -- at a capped rate
    local q = H.spawn({ "/bin/sh", "-c", ("/usr/bin/curl -s --limit-rate %s 'http://127.0.0.1:%d/download?bytes=%d&ms=1&every=32' | wc -c > %s"):format(
      H.sanitized and "20M" or "400M", sport, size, out) })
    q.sanitizer_checked = true
    H.wait_for(function() sample(); return not q:alive() end, H.T(240), "the download", 0.2)
    assert.equal(size, tonumber(H.read_file(out)))
    -- ASan holds freed blocks in its quarantine (256 MiB by default), so
    -- its RSS climbs with any churn; release must stay within 48 MiB
    local slack = H.sanitized and 160 * 1024 or 48 * 1024
    assert.is_true(max_rss - rss0 < slack, ("RSS grew from %d to %d KiB"):format(rss0, max_rss))
  end)

  it("one of three upstreams killed under load: zero 5xx for idempotent requests", function()
    local out = H.tmpdir() .. "/load.json"
    local n = H.sanitized and 1500 or 6000
    local p = H.spawn({ "/bin/sh", "-c", ("%s %s/proxy_load.js %d /id %d 8 > %s"):format(JS.node, JS.dir, port, n, out) })
    p.sanitizer_checked = true
    -- kill b once a third of the load went through
    H.wait_for(function()
      local _, body = curl(("'http://127.0.0.1:%d/hits'"):format(ups[2].port))
      return not p:alive() or cjson.decode(body).requests > n / 6
    end, H.T(60), "load reaching b", 0.05)
    ups[2]:kill(H.SIGKILL)
    H.wait_for(function() return not p:alive() end, H.T(120), "the load")
    local r = cjson.decode((assert(H.read_file(out))))
    assert.same({ ["200"] = n }, r.status)
    assert.equal(0, r.errors)
    assert.is_true((r.bodies.a or 0) > 0 and (r.bodies.c or 0) > 0)
    ups[2] = node_up("b")
  end)
end)

describe("mp.upstream in front of python3 -m http.server and nginx", function()
  local start, cleanup = H.fixture_servers("upstream_app.lua")
  local dir, py, ngx, port
  local nginx_bin = H.exists("/usr/sbin/nginx") and "/usr/sbin/nginx" or nil

  setup(function()
    dir = H.tmpdir()
    lfs.mkdir(dir .. "/www")
    local f = assert(io.open(dir .. "/www/file.bin", "wb"))
    for i = 1, 300 do f:write(string.rep(string.char(i % 256), 1000 + i)) end
    f:close()
    local pport = H.free_port()
    py = H.spawn({ "/usr/bin/python3", "-m", "http.server", tostring(pport), "--bind", "127.0.0.1",
      "--directory", dir .. "/www" })
    py.sanitizer_checked = true
    py.port = pport
    H.wait_for(function() return H.is_listening(pport) end, H.T(10), "python http.server")
    local ports = { pport }
    if nginx_bin then
      local nport = H.free_port()
      lfs.mkdir(dir .. "/ngx")
      H.write_file(dir .. "/ngx/nginx.conf", ([[
daemon off; master_process off; worker_processes 1; error_log %s/ngx/error.log warn; pid %s/ngx/nginx.pid;
events { worker_connections 256; }
http { access_log off; server { listen 127.0.0.1:%d; root %s/www; } }
]]):format(dir, dir, nport, dir))
      ngx = H.spawn({ nginx_bin, "-p", dir .. "/ngx", "-c", dir .. "/ngx/nginx.conf" })
      ngx.sanitizer_checked = true
      H.wait_for(function() return H.is_listening(nport) end, H.T(10), "nginx")
      ports[2] = nport
    end
    local sport = H.free_port()
    local csv = table.concat(ports, ",")
    local _
    _, port = start({ sport, csv, "-", 0 }, { threads = 1 })
  end)
  teardown(function()
    if py and py:alive() then py:kill(H.SIGKILL) end
    if ngx and ngx:alive() then ngx:kill(H.SIGKILL) end
    cleanup()
  end)

  it("a file, a HEAD and a 404 come through from each, unchanged", function()
    local want = H.read_file(dir .. "/www/file.bin")
    local seen = {}
    for _ = 1, 6 do
      local p = assert(io.popen(("/usr/bin/curl -s -D - 'http://127.0.0.1:%d/file.bin'"):format(port)))
      local out = p:read("*a")
      p:close()
      local head, body = out:match("^(.-\r\n)\r\n(.*)$")
      assert.equal(#want, #body)
      assert.is_true(body == want)
      seen[(head:match("\r\n[Ss]erver: (%a+)") or "?")] = true
      local hd = curl_head(("-I 'http://127.0.0.1:%d/file.bin'"):format(port))
      assert.truthy(hd:find("Content%-Length: " .. #want) or hd:find("content%-length: " .. #want), hd)
      assert.equal(404, (curl(("'http://127.0.0.1:%d/none'"):format(port))))
    end
    assert.is_true(seen.SimpleHTTP or false)
    if nginx_bin then assert.is_true(seen.nginx or false) end
  end)
end)

describe("mp.upstream health checks across -w 2 -t 2", function()
  local start, cleanup = H.fixture_servers("upstream_app.lua")
  local ups, port
  local interval = 300

  local function hits(u)
    local _, body = curl(("'http://127.0.0.1:%d/hits'"):format(u.port))
    return cjson.decode(body)
  end
  local function state_of(addr)
    local _, body = curl(("'http://127.0.0.1:%d/_servers'"):format(port))
    for _, s in ipairs(cjson.decode(body)) do
      if s.addr == addr then return s.state end
    end
  end

  setup(function()
    ups = { node_up("a"), node_up("b"), node_up("c") }
    local t = {}
    for i, u in ipairs(ups) do t[i] = u.port end
    local _
    _, port = start({ H.free_port(), table.concat(t, ","), "-", interval }, { workers = 2, threads = 2 })
  end)
  teardown(function()
    for _, u in ipairs(ups) do if u:alive() then u:kill(H.SIGKILL) end end
    cleanup()
  end)

  it("checks each server once per interval, not once per worker or lane", function()
    local h0, t0 = hits(ups[1]).health, H.now()
    H.sleep(H.T(3))
    local h1, t1 = hits(ups[1]).health, H.now()
    local want = (t1 - t0) * 1000 / interval
    -- four lanes checking on their own would make 4x as many
    assert.is_true(h1 - h0 >= want * 0.5 and h1 - h0 <= want * 1.5 + 2,
      ("%d checks in %.1f s at %d ms"):format(h1 - h0, t1 - t0, interval))
  end)

  it("a failing check takes a server out at its first failure (fails = 1), and passes = 2 bring it back; every lane agrees", function()
    local b = ups[2]
    local addr = "127.0.0.1:" .. b.port
    assert.equal("up", state_of(addr))
    curl(("'http://127.0.0.1:%d/sick'"):format(b.port))
    local h0 = hits(b).health
    H.wait_for(function() return state_of(addr) == "down" end, H.T(10), "b marked down")
    -- out after the first failed check (one more may have been under way)
    assert.is_true(hits(b).health - h0 <= 2, "checks before down: " .. (hits(b).health - h0))
    -- every lane of both workers sends nothing to b now
    local r = load(port, "/id", 200, 8)
    assert.same({ ["200"] = 200 }, r.status)
    assert.is_nil(r.bodies.b, cjson.encode(r.bodies))
    -- each lane adds its counts to the dictionary once a second: wait for
    -- the flush that carries this load's
    local m
    local want = 'moonport_upstream_requests_total{upstream="rr",server="127.0.0.1:' .. ups[1].port .. '"} '
    H.wait_for(function()
      m = select(2, curl(("'http://127.0.0.1:%d/metrics'"):format(port)))
      local n = tonumber(m:match(want:gsub("%p", "%%%0") .. "(%d+)"))
      return n and n > 0
    end, H.T(10), "the load's counts in /metrics")
    assert.truthy(m:find(('moonport_upstream_up{upstream="rr",server="%s"} 0'):format(addr), 1, true), m)
    local w0 = hits(b).healthy
    curl(("'http://127.0.0.1:%d/well'"):format(b.port))
    H.wait_for(function() return state_of(addr) == "up" end, H.T(10), "b back")
    local took = hits(b).healthy - w0
    assert.is_true(took >= 2 and took <= 3, "checks before up: " .. took)
    H.wait_for(function()
      local rr = load(port, "/id", 60, 6)
      return (rr.bodies.b or 0) > 0
    end, H.T(10), "traffic to b again")
  end)
end)

describe("mp.upstream: one of three killed under load, the checks alone taking it out (-w 2 -t 2)", function()
  local start, cleanup = H.fixture_servers("upstream_app.lua")
  local ups, port
  local interval = 300

  local function hits(u)
    local _, body = curl(("'http://127.0.0.1:%d/hits'"):format(u.port))
    return cjson.decode(body)
  end
  local function state_of(addr)
    local _, body = curl(("'http://127.0.0.1:%d/_servers'"):format(port))
    for _, s in ipairs(cjson.decode(body)) do
      if s.addr == addr then return s.state end
    end
  end

  setup(function()
    ups = { node_up("a"), node_up("b"), node_up("c") }
    local t = {}
    for i, u in ipairs(ups) do t[i] = u.port end
    local _
    -- max_fails = 0: no passive marks, so what takes b out is a check
    _, port = start({ H.free_port(), table.concat(t, ","), "-", interval, "-", 0 },
      { workers = 2, threads = 2 })
  end)
  teardown(function()
    for _, u in ipairs(ups) do if u:alive() then u:kill(H.SIGKILL) end end
    cleanup()
  end)

  it("zero 5xx for idempotent requests; b out within one check interval, back after passes = 2", function()
    local b = ups[2]
    local addr = "127.0.0.1:" .. b.port
    assert.equal("up", state_of(addr))
    local out = H.tmpdir() .. "/load.json"
    local n = H.sanitized and 1500 or 6000
    local p = H.spawn({ "/bin/sh", "-c", ("%s %s/proxy_load.js %d /id %d 8 > %s"):format(JS.node, JS.dir, port, n, out) })
    p.sanitizer_checked = true
    H.wait_for(function() return not p:alive() or hits(b).requests > n / 6 end, H.T(60), "load reaching b", 0.05)
    assert.truthy(p:alive(), "the load ended before b was killed")
    b:kill(H.SIGKILL)
    -- a is checked in the same rounds as b: its checks after the kill count
    -- them. The round that finds b dead is the first whose check of b
    -- starts after the kill, so at most one check of a comes after h0 and
    -- before b is out (fails = 3 would take two more rounds)
    local h0 = hits(ups[1]).health
    local h_down
    H.wait_for(function()
      local h = hits(ups[1]).health
      if state_of(addr) == "down" then h_down = h; return true end
    end, H.T(20), "b marked down", 0.02)
    assert.is_true(h_down - h0 <= 1, "check rounds before b was out: " .. (h_down - h0))
    H.wait_for(function() return not p:alive() end, H.T(120), "the load")
    local r = cjson.decode((assert(H.read_file(out))))
    assert.same({ ["200"] = n }, r.status)
    assert.equal(0, r.errors)
    assert.is_true((r.bodies.a or 0) > 0 and (r.bodies.b or 0) > 0 and (r.bodies.c or 0) > 0, cjson.encode(r.bodies))
    -- b again, on its port: back after two checks that pass
    local nb = H.spawn({ JS.node, JS.dir .. "/proxy_upstream.js", "b", tostring(b.port) })
    nb.sanitizer_checked = true
    nb.port = cjson.decode(nb:wait_stdout("{[^\n]*}", H.T(10))).port
    assert.equal(b.port, nb.port)
    ups[2] = nb
    H.wait_for(function() return state_of(addr) == "up" end, H.T(20), "b back")
    local took = hits(nb).healthy
    assert.is_true(took >= 2 and took <= 3, "checks before up: " .. took)
    H.wait_for(function()
      local rr = load(port, "/id", 60, 6)
      assert.same({ ["200"] = 60 }, rr.status)
      return (rr.bodies.b or 0) > 0
    end, H.T(10), "traffic to b again")
  end)
end)

describe("mp.upstream to an HTTPS upstream (Node https, a test CA)", function()
  local start, cleanup = H.fixture_servers("upstream_app.lua")
  local plain, tup, port, sport

  setup(function()
    local ca = H.test_ca({ "localhost" })
    plain = node_up("a")
    tup = H.spawn({ "/usr/bin/env", "TLS_CERT=" .. ca.localhost.cert, "TLS_KEY=" .. ca.localhost.key,
      JS.node, JS.dir .. "/proxy_upstream.js", "t" })
    tup.sanitizer_checked = true
    tup.port = cjson.decode(tup:wait_stdout("{[^\n]*}", H.T(10))).port
    sport = H.free_port()
    local _
    _, port = start({ sport, tostring(plain.port), "-", 0, "-", 1, tup.port, ca.ca }, { threads = 2 })
  end)
  teardown(function()
    for _, u in ipairs { plain, tup } do if u and u:alive() then u:kill(H.SIGKILL) end end
    cleanup()
  end)

  local function https_hits()
    local p = assert(io.popen(("/usr/bin/curl -sk 'https://127.0.0.1:%d/hits'"):format(tup.port)))
    local out = p:read("*a")
    p:close()
    return cjson.decode(out)
  end

  it("proxies over TLS, verified by address and by name, on kept connections", function()
    local h0 = https_hits()
    for _, which in ipairs { "tls", "tlsname" } do
      for _ = 1, 10 do
        local code, body = curl(("-H 'X-Up: %s' -d 'over tls' 'http://127.0.0.1:%d/echo'"):format(which, port))
        assert.equal(200, code, body)
        local e = cjson.decode(body)
        assert.equal("t", e.id)
        assert.is_true(e.encrypted)
        assert.equal("over tls", e.body)
      end
    end
    -- 20 requests on 2 lanes, two upstream objects: each lane's pool keeps
    -- one connection per object, so at most 4 handshakes, not 20 (besides
    -- one per check, which closes, and this curl's own)
    local h1 = https_hits()
    local made = h1.conns - h0.conns - (h1.health - h0.health) - 1
    assert.is_true(made >= 1 and made <= 4, "TLS handshakes: " .. made)
  end)

  it("streams a big download and upload over TLS", function()
    local size = H.sanitized and 4 * 1024 * 1024 or 64 * 1024 * 1024
    local p = assert(io.popen(("/usr/bin/curl -s -H 'X-Up: tls' 'http://127.0.0.1:%d/download?bytes=%d' | wc -c"):format(sport, size)))
    assert.equal(size, tonumber(p:read("*a")))
    p:close()
    p = assert(io.popen(("head -c %d /dev/zero | /usr/bin/curl -s -T - -H 'X-Up: tls' 'http://127.0.0.1:%d/upload'"):format(size, sport)))
    local r = cjson.decode(p:read("*a"))
    p:close()
    assert.equal(size, r.bytes)
  end)

  it("a certificate that fails the check is a 502 saying why, and nothing reaches the upstream", function()
    local r0 = https_hits()
    local code, body = curl(("-H 'X-Up: tlsbad' 'http://127.0.0.1:%d/id'"):format(port))
    assert.equal(502, code)
    assert.truthy(body:find("certificate verify failed", 1, true), body)
    code, body = curl(("-H 'X-Up: tlssni' 'http://127.0.0.1:%d/id'"):format(port))
    assert.equal(502, code)
    assert.truthy(body:find("hostname mismatch", 1, true), body)
    -- besides the checks, the one request since r0 is this hits call
    local r1 = https_hits()
    assert.equal(1, (r1.requests - r1.health) - (r0.requests - r0.health))
  end)

  it("checks a TLS server over TLS", function()
    local h0 = https_hits().health
    H.wait_for(function() return https_hits().health >= h0 + 2 end, H.T(10), "checks over TLS")
    local _, body = curl(("'http://127.0.0.1:%d/_servers?up=tls'"):format(port))
    assert.equal("up", cjson.decode(body)[1].state)
    -- a sick server goes down by its TLS check
    local p = assert(io.popen(("/usr/bin/curl -sk 'https://127.0.0.1:%d/sick'"):format(tup.port)))
    p:read("*a")
    p:close()
    H.wait_for(function()
      local _, b = curl(("'http://127.0.0.1:%d/_servers?up=tls'"):format(port))
      return cjson.decode(b)[1].state == "down"
    end, H.T(10), "down by a TLS check")
    p = assert(io.popen(("/usr/bin/curl -sk 'https://127.0.0.1:%d/well'"):format(tup.port)))
    p:read("*a")
    p:close()
    H.wait_for(function()
      local _, b = curl(("'http://127.0.0.1:%d/_servers?up=tls'"):format(port))
      return cjson.decode(b)[1].state == "up"
    end, H.T(10), "up again")
  end)
end)

describe("mp.upstream: a name with several addresses, asked again on its TTL", function()
  local start, cleanup = H.fixture_servers("upstream_app.lua")
  local stub, plain, pool, port, list
  local peers = {}

  local function addrs()
    local _, body = curl(("'http://127.0.0.1:%d/_servers?up=pool'"):format(port))
    local t = {}
    for _, s in ipairs(cjson.decode(body)) do t[#t + 1] = s.addr end
    table.sort(t)
    return table.concat(t, " ")
  end

  setup(function()
    list = H.tmpdir() .. "/pool.txt"
    H.write_file(list, "127.0.0.1\n127.0.0.2\n")
    stub = H.spawn({ "/usr/bin/env", "DNS_STUB_POOL=" .. list, "/usr/bin/python3", H.fixture("dns_stub.py") })
    stub.sanitizer_checked = true
    local dport = stub:wait_stdout("ready (%d+)", H.T(5))
    -- three Node servers on one port, at 127.0.0.1, .2 and .3
    pool = H.free_port()
    for i = 1, 3 do
      local p = H.spawn({ "/usr/bin/env", "BIND=127.0.0." .. i, JS.node, JS.dir .. "/proxy_upstream.js",
        "p" .. i, tostring(pool) })
      p.sanitizer_checked = true
      assert.equal(pool, cjson.decode(p:wait_stdout("{[^\n]*}", H.T(10))).port)
      peers[i] = p
    end
    plain = node_up("a")
    local _
    _, port = start({ H.free_port(), tostring(plain.port), "-", 0, "-", 1, "-", "-", pool },
      { threads = 2, env = { MOONPORT_DNS_SERVERS = "127.0.0.1:" .. dport } })
  end)
  teardown(function()
    for _, u in ipairs(peers) do if u:alive() then u:kill(H.SIGKILL) end end
    if plain and plain:alive() then plain:kill(H.SIGKILL) end
    if stub and stub:alive() then stub:kill(H.SIGKILL) end
    cleanup()
  end)

  it("balances over every address of the name, and follows a new set within its TTL", function()
    local r = load(port, "/id", 200, 4, { "x-up=pool" })
    assert.same({ ["200"] = 200 }, r.status)
    assert.is_true((r.bodies.p1 or 0) >= 80 and (r.bodies.p2 or 0) >= 80, cjson.encode(r.bodies))
    assert.is_nil(r.bodies.p3)
    assert.equal(("127.0.0.1:%d 127.0.0.2:%d"):format(pool, pool), addrs())
    -- the name now has .2 and .3: within the record's TTL (1 s) and the
    -- once-a-second asking, every lane sends there
    H.write_file(list, "127.0.0.2\n127.0.0.3\n")
    H.wait_for(function()
      local rr = load(port, "/id", 40, 4, { "x-up=pool" })
      assert.same({ ["200"] = 40 }, rr.status)
      return not rr.bodies.p1 and (rr.bodies.p3 or 0) > 0
    end, H.T(10), "the new addresses in use")
    r = load(port, "/id", 200, 4, { "x-up=pool" })
    assert.same({ ["200"] = 200 }, r.status)
    assert.is_nil(r.bodies.p1)
    assert.is_true((r.bodies.p2 or 0) >= 80 and (r.bodies.p3 or 0) >= 80, cjson.encode(r.bodies))
  end)

  it("a name becomes at most 16 peers (the resolver's limit: the answer's first 16)", function()
    local t = {}
    for i = 1, 20 do t[i] = "127.0.1." .. i end
    H.write_file(list, table.concat(t, "\n") .. "\n")
    local want = {}
    for i = 1, 16 do want[i] = t[i] .. ":" .. pool end
    table.sort(want)
    -- the list is read on the lane of the request: ask until both lanes
    -- (two connections) showed the capped set
    H.wait_for(function() return addrs() == table.concat(want, " ") end, H.T(10), "the capped set")
    H.wait_for(function() return addrs() == table.concat(want, " ") end, H.T(10), "the capped set again")
  end)
end)

describe("mp.upstream least_conn across lanes (-t 2)", function()
  local start, cleanup = H.fixture_servers("upstream_app.lua")
  local a, b, port
  local curls = {}

  local function hits(u)
    local _, body = curl(("'http://127.0.0.1:%d/hits'"):format(u.port))
    return cjson.decode(body)
  end

  local function active_of(u)
    local _, body = curl(("'http://127.0.0.1:%d/_servers?up=least'"):format(port))
    for _, s in ipairs(cjson.decode(body)) do
      if s.port == u.port then return s.active end
    end
  end

  setup(function()
    a, b = node_up("a"), node_up("b")
    local _
    _, port = start({ H.free_port(), a.port .. "," .. b.port, "-", 0 }, { threads = 2 })
  end)
  teardown(function()
    for _, c in ipairs(curls) do if c:alive() then c:kill(H.SIGKILL) end end
    for _, u in ipairs { a, b } do if u:alive() then u:kill(H.SIGKILL) end end
    cleanup()
  end)

  it("a request held at one server counts for every lane: the rest go to the other", function()
    curl(("'http://127.0.0.1:%d/hold?on=1'"):format(a.port))
    -- one request at a time, each on a new connection (so on either
    -- lane): it is either answered by b or held at a
    for i = 1, 20 do
      local held0 = hits(a).held
      local out = H.tmpdir() .. "/lc" .. i
      local c = H.spawn({ "/usr/bin/curl", "-s", "-o", out, "-H", "X-Up: least",
        ("http://127.0.0.1:%d/id"):format(port) })
      c.sanitizer_checked = true
      curls[#curls + 1] = c
      -- answered, or held (a new one at a): then the next, so never two
      -- at b at once (b's count then ties with a's)
      H.wait_for(function() return not c:alive() or hits(a).held > held0 end, H.T(10), "request " .. i)
      if not c:alive() then assert.equal("b", H.read_file(out)) end
      -- and b's try counted out (the answer may reach curl before the -1)
      H.wait_for(function() return active_of(b) == 0 end, H.T(10), "b's count back to 0")
    end
    -- per-lane counts would hold one at a in each lane that saw a tie
    assert.equal(1, hits(a).held)
    assert.equal(1, active_of(a))
    assert.equal(0, active_of(b))
    -- released: the count goes back to 0
    curl(("'http://127.0.0.1:%d/hold?on=0'"):format(a.port))
    H.wait_for(function() return active_of(a) == 0 end, H.T(10), "a's count back to 0")
  end)
end)
