-- Spec: a script's own metrics (mp.counter, mp.gauge, mp.histogram) live
-- in memory every process shares: updates from every worker and lane add
-- up exactly with no message between processes, survive a worker killed
-- with kill -9, and come out on the status endpoint with the server's own
-- (promtool checks the text); the HTTP server times every request by
-- status class, and the router by route. The server is
-- spec/fixtures/app_metrics_app.lua.
local H = require "spec.helper"
local cjson = require "cjson"
local ffi = require "ffi" -- kill(2) is declared by spec/helper.lua

local start, cleanup = H.fixture_servers("app_metrics_app.lua")
local PROMTOOL = "/usr/bin/promtool"

local function get(port, target)
  local c = H.connect(port)
  assert(H.send(c, ("GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"):format(target)))
  local data = assert(H.read_to_eof(c, H.T(10)))
  c:close()
  return tonumber(data:match("^HTTP/1.1 (%d+)")), data:match("\r\n\r\n(.*)$")
end

local function metrics(port)
  local st, body = get(port, "/metrics")
  assert.equal(200, st)
  local m = {}
  for line in body:gmatch("[^\n]+") do
    if line:sub(1, 1) ~= "#" then
      local k, v = line:match("^(%S+) (%S+)$")
      assert(k, "a bad line: " .. line)
      m[k] = tonumber(v)
    end
  end
  return m, body
end

describe("app metrics", function()
  after_each(cleanup)

  it("with -w 2 -t 2, counters, gauges and histograms add up exactly across workers and lanes; promtool accepts the text", function()
    local srv, port = start({}, { workers = 2, threads = 2 })
    local n = H.sanitized and 60 or 200
    local pids = {}
    for i = 1, n do
      assert.equal(200, (get(port, "/hit?page=" .. (i % 2 == 0 and "a" or "b"))))
      assert.equal(200, (get(port, "/observe?v=" .. ({ 0.05, 0.3, 0.7, 2 })[i % 4 + 1])))
    end
    local m, text = metrics(port)
    assert.equal(n / 2, m['app_hits_total{page="a"}'], text)
    assert.equal(n / 2, m['app_hits_total{page="b"}'], text)
    assert.equal(0, m.app_inflight)
    local lastpid = m.app_last_pid
    for _, p in ipairs(H.children(srv:pid())) do pids[p] = true end
    assert.truthy(pids[lastpid], "app_last_pid is a worker's pid: " .. tostring(lastpid))
    -- the histogram: 0.05 -> le 0.1; 0.3 -> 0.5; 0.7 -> 1; 2 -> +Inf
    local q = n / 4
    assert.equal(q, m['app_job_seconds_bucket{kind="k",le="0.1"}'])
    assert.equal(2 * q, m['app_job_seconds_bucket{kind="k",le="0.5"}'])
    assert.equal(3 * q, m['app_job_seconds_bucket{kind="k",le="1"}'])
    assert.equal(n, m['app_job_seconds_bucket{kind="k",le="+Inf"}'])
    assert.equal(n, m['app_job_seconds_count{kind="k"}'])
    assert.near(q * (0.05 + 0.3 + 0.7 + 2), m['app_job_seconds_sum{kind="k"}'], 1e-9)
    -- every lane reads the same value
    assert.equal(tostring(n / 2), select(2, get(port, "/value?page=a")))
    -- the text passes promtool
    local file = H.tmpdir() .. "/m.txt"
    H.write_file(file, text)
    local st, out, err = H.exec({ "/bin/sh", "-c", PROMTOOL .. " check metrics < " .. file })
    assert.equal(0, st, out .. err)
    assert.equal(0, srv:stop())
  end)

  it("the counts of a worker killed with kill -9 stay: they were never the worker's", function()
    local srv, port = start({}, { workers = 2, threads = 1 })
    for _ = 1, 40 do get(port, "/hit?page=z") end
    local kids = H.children(srv:pid())
    ffi.C.kill(kids[1], H.SIGKILL)
    ffi.C.kill(kids[2], H.SIGKILL)
    H.wait_for(function()
      local now = H.children(srv:pid())
      return #now == 2 and now[1] ~= kids[1] and now[2] ~= kids[2] and now[1] ~= kids[2]
    end, H.T(10), "both workers replaced")
    H.wait_for(function() return H.is_listening(port) and pcall(metrics, port) end, H.T(10), "serving again")
    for _ = 1, 10 do get(port, "/hit?page=z") end
    assert.equal(50, metrics(port)['app_hits_total{page="z"}'])
    assert.equal(0, srv:stop())
  end)

  it("every request is timed by status class; with the router, by route too", function()
    local _, port = start({}, { workers = 1, threads = 1 })
    local m0 = metrics(port)
    for i = 1, 5 do assert.equal(200, (get(port, "/users/" .. i))) end
    for _ = 1, 3 do assert.equal(200, (get(port, "/slow"))) end
    assert.equal(404, (get(port, "/nowhere")))
    local m = metrics(port)
    local function d(k) return (m[k] or 0) - (m0[k] or 0) end
    assert.equal(5, m['moonport_http_route_duration_seconds_count{route="/users/:id",class="2xx"}'])
    assert.equal(3, m['moonport_http_route_duration_seconds_count{route="/slow",class="2xx"}'])
    -- /slow sleeps 30 ms: never under 25 ms
    assert.equal(0, m['moonport_http_route_duration_seconds_bucket{route="/slow",class="2xx",le="0.025"}'])
    assert.is_true(m['moonport_http_route_duration_seconds_sum{route="/slow",class="2xx"}'] >= 0.09)
    -- the server's own histogram has them all (and the scrape before)
    assert.is_true(d('moonport_http_request_duration_seconds_count{class="2xx"}') >= 8)
    assert.equal(1, d('moonport_http_request_duration_seconds_count{class="4xx"}'))
    assert.equal(0, d('moonport_http_request_duration_seconds_bucket{class="2xx",le="0.025"}') -
      d('moonport_http_request_duration_seconds_bucket{class="2xx",le="0.001"}') - 0 >= 0 and 0 or 1)
    assert.is_true(d('moonport_http_request_duration_seconds_count{class="2xx"}') -
      d('moonport_http_request_duration_seconds_bucket{class="2xx",le="0.025"}') >= 3, "the three slow ones over 25 ms")
    -- a 404 that no route matched has no route series
    assert.falsy(H.plain(select(2, metrics(port)), 'route="/nowhere"'))
  end)

  it("misuse raises with the reason; a series past the limit is dropped and counted, the rest go on", function()
    local _, port = start({}, { workers = 1, threads = 1 })
    local st, body = get(port, "/misuse")
    assert.equal(200, st)
    local e = cjson.decode(body)
    assert.truthy(e.bad_name:find("bad argument #1 to 'mp.counter' (a metric name", 1, true), e.bad_name)
    assert.truthy(e.reserved:find("moonport_ are the server's", 1, true), e.reserved)
    assert.truthy(e.other_type:find("'app_hits_total' is already registered with another type, labels or buckets", 1, true), e.other_type)
    assert.truthy(e.other_labels:find("already registered", 1, true), e.other_labels)
    assert.truthy(e.negative:find("a counter only goes up", 1, true), e.negative)
    assert.truthy(e.missing_label:find("needs a value for label page", 1, true), e.missing_label)
    assert.truthy(e.no_labels:find("label values { page = ... } expected", 1, true), e.no_labels)
    assert.truthy(e.bad_buckets:find("increasing order", 1, true), e.bad_buckets)
    assert.truthy(e.le_label:find("not le", 1, true), e.le_label)
    assert.truthy(e.set_nan_type:find("number expected, got string", 1, true), e.set_nan_type)
    assert.equal("no error", e.same_again)
    for _, msg in pairs(e) do
      if msg ~= "no error" then assert.truthy(msg:find("app_metrics_app.lua:%d+:"), msg) end
    end
    -- 8192 series in all: the app's, the router's and these
    assert.equal(200, (get(port, "/hit?page=a")))
    assert.equal(200, (get(port, "/many?n=8300")))
    local m, text = metrics(port)
    assert.is_true(m.moonport_metric_updates_dropped_total >= 100, tostring(m.moonport_metric_updates_dropped_total))
    assert.equal(1, m['app_many_total{i="1"}'], #text .. text:sub(1, 300) .. text:sub(-300))
    assert.falsy(H.plain(text, 'app_many_total{i="8300"}'))
    -- what exists still counts; a new series is dropped
    assert.equal(200, (get(port, "/hit?page=a")))
    assert.equal(200, (get(port, "/hit?page=new")))
    m = metrics(port)
    assert.equal(2, m['app_hits_total{page="a"}'])
    assert.is_nil(m['app_hits_total{page="new"}'])
  end)
end)
