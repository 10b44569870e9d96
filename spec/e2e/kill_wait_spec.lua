-- Spec: t:kill of a task waiting in s:receive, mp.tcp's connect,
-- mp.resolve or mp.wait cancels that wait at once (t:kill returns
-- "cancelled", not "dropped") and nothing of it resumes later
-- (spec/fixtures/kill_app.lua; ASan's leak check covers what was held).
local H = require "spec.helper"

local start, cleanup = H.fixture_servers("kill_app.lua")

local get = H.curl_json

describe("t:kill cancels mp.tcp / mp.resolve / mp.wait waits", function()
  after_each(cleanup) -- the servers and the stub DNS

  local srv, port
  before_each(function()
    local stub = H.spawn({ "/usr/bin/python3", H.fixture("dns_stub.py") })
    local dport = stub:wait_stdout("ready (%d+)", H.T(5))
    local env = { MOONPORT_WORKERS = "1", MOONPORT_DNS_SERVERS = "127.0.0.1:" .. dport }
    if H.bin:find("asan", 1, true) then env.ASAN_OPTIONS = "detect_leaks=1:abort_on_error=0" end
    srv, port = start({ H.free_port() }, { env = env, threads = 1 })
  end)

  local function check(r, raw)
    assert.equal("cancelled", r.how, raw)
    assert.equal("killed", r.err, raw)
    assert.equal("killed", r.status, raw)
    assert.is_true(r.ms < 100 * H.T(1), raw)
  end

  it("a task in s:receive; the socket still reads afterwards", function()
    local r, raw = get(port, "/recv")
    check(r, raw)
    assert.equal("late", r.after, raw)
    r, raw = get(port, "/recv?close") -- its resume already posted
    check(r, raw)
    H.sleep(0.3)
    assert.is_nil(srv:stdout():find("AFTER", 1, true), srv:stdout())
    assert.equal(0, srv:stop())
  end)

  it("a task connecting (its lookup never answers) and one in mp.resolve", function()
    local r, raw = get(port, "/connect")
    check(r, raw)
    r, raw = get(port, "/resolve")
    check(r, raw)
    H.sleep(0.2)
    assert.is_nil(srv:stdout():find("AFTER", 1, true), srv:stdout())
    assert.equal(0, srv:stop())
  end)

  it("a task in mp.wait, woken or not; a wake after the kill is a no-op", function()
    local r, raw = get(port, "/wait")
    check(r, raw)
    r, raw = get(port, "/wait?fired")
    check(r, raw)
    H.sleep(0.1)
    assert.is_nil(srv:stdout():find("AFTER", 1, true), srv:stdout())
    assert.equal(0, srv:stop())
  end)
end)
