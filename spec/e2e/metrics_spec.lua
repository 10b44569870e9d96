-- Spec: the server's counters. mp.http { status = "/metrics" } answers them
-- in the Prometheus text format (checked by Debian's promtool, and scraped
-- by a real prometheus the spec starts, read back through its HTTP API);
-- mp.stats() gives them to a script, for the whole server (every worker
-- and lane, the counts of a worker that died included), a process or a
-- lane. The server is spec/fixtures/http_app.lua.
local H = require "spec.helper"
local cjson = require "cjson"
local ffi = require "ffi"

local start, cleanup = H.fixture_servers("http_app.lua")
local ws_start, ws_cleanup = H.fixture_servers("ws_app.lua")

local CURL = "/usr/bin/curl"
local PROMTOOL = "/usr/bin/promtool"
local PROMETHEUS = "/usr/bin/prometheus"

-- The body curl gets from url (nil if it fails).
local function curl(url)
  local p = io.popen(CURL .. " -s --max-time 5 '" .. url .. "'")
  local out = p:read("*a")
  p:close()
  return out
end

local function get(port, target)
  local c = H.connect(port)
  assert(H.send(c, ("GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"):format(target)))
  local data = assert(H.read_to_eof(c, H.T(5)))
  c:close()
  local status = tonumber(data:match("^HTTP/1.1 (%d+)"))
  return status, data:match("\r\n\r\n(.*)$"), data
end

-- { name{labels} = value } of a Prometheus text.
local function parse(text)
  local m = {}
  for line in text:gmatch("[^\n]+") do
    if line:sub(1, 1) ~= "#" then
      local k, v = line:match("^(%S+) (%S+)$")
      assert(k, "a bad line: " .. line)
      m[k] = tonumber(v)
    end
  end
  return m
end

local function metrics(port)
  local st, body = get(port, "/metrics")
  assert.equal(200, st)
  return parse(body), body
end

describe("metrics", function()
  after_each(function() cleanup() ws_cleanup() end)

  it("status = { path =, allow = fn }: the app's check guards the metrics (403 without it), other paths still reach on_request", function()
    local _, port = start({ "status=/metrics", "status_token=s3cret" })
    local st, body = get(port, "/metrics")
    assert.equal(403, st, body)
    local c = H.connect(port)
    assert(H.send(c, "GET /metrics HTTP/1.1\r\nHost: t\r\nX-Token: s3cret\r\nConnection: close\r\n\r\n"))
    local data = assert(H.read_to_eof(c, H.T(5)))
    assert.truthy(data:find("^HTTP/1.1 200"), data)
    assert.truthy(data:find("Content-Type: text/plain; version=0.0.4", 1, true), data)
    local m = parse(data:match("\r\n\r\n(.*)$"))
    assert.truthy(next(m), data)
    st = get(port, "/hello")
    assert.equal(200, st)
  end)

  it("status = \"/metrics\" with -w 2 and -t 2: requests by class, connections and bytes counted across every worker and lane, exactly; promtool accepts the text", function()
    local _, port = start({ "status=/metrics" }, { options = { "-w", "2" }, threads = 2 })
    local m0 = metrics(port)
    for _ = 1, 40 do assert.equal(200, (get(port, "/hello"))) end
    for _ = 1, 7 do assert.equal(404, (get(port, "/nope"))) end
    local c = H.connect(port)
    assert(H.send(c, "BAD\r\n\r\n"))
    H.read_to_eof(c, H.T(5))
    assert.equal(500, (get(port, "/error")))
    local m, text = metrics(port)
    -- the first /metrics answer counted as a 2xx too
    assert.equal(40 + 1, m['moonport_http_requests_total{class="2xx"}'] - m0['moonport_http_requests_total{class="2xx"}'])
    assert.equal(7 + 1, m['moonport_http_requests_total{class="4xx"}'] - m0['moonport_http_requests_total{class="4xx"}'])
    assert.equal(1, m['moonport_http_requests_total{class="5xx"}'] - m0['moonport_http_requests_total{class="5xx"}'])
    assert.is_true(m.moonport_connections_accepted_total - m0.moonport_connections_accepted_total >= 50)
    assert.is_true(m.moonport_received_bytes_total > 40 * 30)
    assert.is_true(m.moonport_sent_bytes_total > 40 * 12)
    assert.equal(2, m.moonport_workers)
    -- a Lua heap per live lane: the root's and 2 x 2 workers' lanes
    local lanes = 0
    for k in pairs(m) do if k:find("^moonport_lua_memory_bytes{") then lanes = lanes + 1 end end
    assert.equal(5, lanes, text)
    -- promtool, the real parser
    local path = H.tmpdir() .. "/metrics.txt"
    local f = assert(io.open(path, "wb"))
    f:write(text)
    f:close()
    local ok = os.execute(PROMTOOL .. " check metrics < " .. path .. " > " .. path .. ".out 2>&1")
    assert.is_true(ok == true or ok == 0, "promtool: " .. (H.read_file(path .. ".out") or ""))
  end)

  it("mp.stats(): the whole server by default, a process or a lane with scope; mp.metrics() is the same text", function()
    local _, port = start({}, { options = { "-w", "2" } })
    for _ = 1, 20 do get(port, "/hello") end
    local _, body = get(port, "/stats")
    local s = cjson.decode(body)
    assert.is_true(s.requests["2xx"] >= 20, body)
    assert.equal(s.requests["1xx"] + s.requests["2xx"] + s.requests["3xx"]
      + s.requests["4xx"] + s.requests["5xx"], s.requests.total)
    assert.is_true(s.connections.accepted >= 21)
    assert.is_true(s.connections.open >= 1)
    assert.equal(2, s.workers)
    assert.equal("off", s.redis)
    assert.is_true(s.uptime > 0)
    assert.is_true(s.lua_bytes > 0)
    assert.is_true(s.loop_lag >= 0)
    -- a lane's figures are a part of its process's, a process's of the whole
    local _, abody = get(port, "/stats?scope=all")
    local a = cjson.decode(abody)
    for _, k in ipairs { "1xx", "2xx", "3xx", "4xx", "5xx", "total" } do
      assert.is_true(a.lane.requests[k] <= a.process.requests[k], abody)
      assert.is_true(a.process.requests[k] <= a.cluster.requests[k], abody)
    end
    assert.is_true(a.lane.connections.accepted <= a.process.connections.accepted, abody)
    assert.is_true(a.process.connections.accepted < a.cluster.connections.accepted, abody)
    assert.is_true(a.process.requests.total < a.cluster.requests.total, "both workers served: " .. abody)
    local st, text = get(port, "/metrics_lua")
    assert.equal(200, st)
    assert.is_truthy(parse(text)['moonport_http_requests_total{class="2xx"}'])
    local bad = select(1, get(port, "/stats?scope=planet"))
    assert.equal(500, bad)
  end)

  it("a worker killed with SIGKILL: it is restarted (worker_restarts_total), and the requests it answered stay counted", function()
    local srv, port = start({ "status=/metrics" }, { options = { "-w", "2" } })
    for _ = 1, 30 do get(port, "/hello") end
    local before = metrics(port)['moonport_http_requests_total{class="2xx"}']
    local kids = H.children(srv:pid())
    assert.equal(2, #kids)
    -- idle connections held across the kill, spread over both workers:
    -- those the dead worker held must stop counting as open
    local held = {}
    for i = 1, 8 do held[i] = H.connect(port) end
    H.wait_for(function() return metrics(port).moonport_connections_open >= 9 end,
      H.T(10), "the held connections counted as open")
    ffi.C.kill(kids[1], H.SIGKILL)
    H.wait_for(function()
      local m = metrics(port)
      return m['moonport_worker_restarts_total{cause="crash"}'] == 1 and m['moonport_worker_restarts_total{cause="reload"}'] == 0 and #H.children(srv:pid()) == 2
    end, H.T(10), "the restart to be counted")
    local m = metrics(port)
    assert.is_true(m['moonport_http_requests_total{class="2xx"}'] >= before, "counts lost with the worker")
    assert.is_true(m.moonport_connections_open >= 1)
    for _, c in ipairs(held) do c:close() end
    -- each closed connection stops counting once its lane has read the EOF
    -- (on a busy machine, a scrape can come first): so wait, not one look;
    -- then only the scrape itself is open (the root's pipes to its workers
    -- are not clients)
    local open
    H.wait_for(function()
      open = metrics(port).moonport_connections_open
      return open == 1
    end, H.T(10), function() return "a dead worker's connections still count as open: " .. tostring(open) end)
  end)

  it("a real Prometheus scrapes a -w 2 server and its HTTP API gives the values back", function()
    local _, port = start({ "status=/metrics" }, { options = { "-w", "2" } })
    for _ = 1, 25 do get(port, "/hello") end
    local dir = H.tmpdir()
    local pport = H.free_port()
    local cfg = assert(io.open(dir .. "/prometheus.yml", "wb"))
    cfg:write(([[
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: moonport
    static_configs:
      - targets: ["127.0.0.1:%d"]
]]):format(port))
    cfg:close()
    local prom = H.spawn({ PROMETHEUS, "--config.file=" .. dir .. "/prometheus.yml",
      "--storage.tsdb.path=" .. dir .. "/data", "--web.listen-address=127.0.0.1:" .. pport,
      "--log.level=warn" })
    local value
    local ok, err = pcall(H.wait_for, function()
      if not prom:alive() then error("prometheus exited: " .. prom:describe(), 0) end
      local out = curl(("http://127.0.0.1:%d/api/v1/query?query=%s"):format(pport,
        "moonport_http_requests_total%7Bclass%3D%222xx%22%7D"))
      local okj, r = pcall(cjson.decode, out or "")
      if not okj or r.status ~= "success" or #r.data.result == 0 then return false end
      value = tonumber(r.data.result[1].value[2])
      return value and value >= 25
    end, H.T(30), "prometheus to scrape moonport")
    prom:kill(H.SIGTERM)
    prom:wait_exit(H.T(10))
    assert(ok, err)
    assert.is_true(value >= 25)
  end)

  it("open WebSockets and SSE streams are gauges that go down when they close; pub/sub deliveries are counted", function()
    local _, port = ws_start { "status=/metrics" }
    local sse = H.connect(port)
    assert(H.send(sse, "GET /sse_sub?ch=m HTTP/1.1\r\nHost: t\r\n\r\n"))
    assert(H.read_until(sse, "subscribed", H.T(5)))
    local ws = H.connect(port)
    assert(H.send(ws, "GET /echo HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      .. "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"))
    assert(H.read_until(ws, "\r\n\r\n", H.T(5)))
    local m = metrics(port)
    assert.equal(1, m.moonport_sse_streams_open)
    assert.equal(1, m.moonport_websockets_open)
    local d0 = m.moonport_pubsub_delivered_total
    for i = 1, 3 do assert.equal(200, (get(port, "/pub?ch=m&msg=hi" .. i))) end
    assert(H.read_until(sse, "hi3", H.T(5)))
    H.wait_for(function() return metrics(port).moonport_pubsub_delivered_total - d0 >= 3 end,
      H.T(5), "three deliveries counted")
    sse:close()
    ws:close()
    H.wait_for(function()
      local m2 = metrics(port)
      return m2.moonport_sse_streams_open == 0 and m2.moonport_websockets_open == 0
    end, H.T(5), "the streams to be counted closed")
  end)
end)
