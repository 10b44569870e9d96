-- Spec: mp.spawn, mp.join, mp.wait_any, t:kill and mp.semaphore through the
-- real binary: an mp.http handler (spec/fixtures/task_app.lua, one path
-- per case, answering JSON) runs tasks side by side on its lane. Times are
-- measured inside the server (mp.now) and bounded generously (H.T).
local H = require "spec.helper"

local socket = require "socket"
local start, cleanup = H.fixture_servers("task_app.lua")
local REDIS_SERVER = os.getenv("MOONPORT_TEST_REDIS_SERVER") or "/usr/bin/redis-server"
if not H.exists(REDIS_SERVER) then REDIS_SERVER = "/usr/sbin/redis-server" end

local get = H.curl_json

-- MOONPORT_WORKERS=1: one process, no fork; the server is the worker.
local function worker_rss(srv) return assert(srv:rss_kb()) end

describe("mp.spawn / mp.join / t:kill / mp.semaphore (end to end)", function()
  after_each(cleanup)
  local srv, port
  local env = { MOONPORT_WORKERS = "1" }
  if H.bin:find("asan", 1, true) then
    -- what tasks, parks and killed waits leave behind shows at exit
    env.ASAN_OPTIONS = "detect_leaks=1:abort_on_error=0"
  end
  before_each(function()
    srv, port = start({}, { env = env })
  end)

  it("three tasks sleeping 100/200/300 ms, joined, take the slowest's time, not the sum", function()
    local r, raw = get(port, "/join3")
    assert.is_true(r.ms >= 295, raw)
    assert.is_true(r.ms < 550 * H.T(1), raw)
    assert.same({ ["1"] = "a", ["2"] = 100, n = 2 }, r.a)
    assert.same({ ["1"] = "b", ["2"] = 200, n = 2 }, r.b)
    assert.same({ ["1"] = "c", ["2"] = 300, n = 2 }, r.c)
    assert.equal(0, srv:stop())
  end)

  it("wait_any returns the fastest task and its results; the slow one is still running", function()
    local r, raw = get(port, "/wait_any")
    assert.equal("fast", r.first, raw)
    assert.equal("fast", r.r["1"], raw)
    assert.is_true(r.ms >= 45 and r.ms < 350 * H.T(1), raw)
    assert.equal("running", r.slow_status, raw)
    assert.equal("killed", r.after_kill, raw)
    assert.equal(0, srv:stop())
  end)

  it("kill ends a task sleeping 10 s at once; joiners see nil, 'killed'; its sleep never fires", function()
    local r, raw = get(port, "/kill?long:10000")
    assert.is_true(r.ms < 100 * H.T(1), raw)
    assert.equal("killed", r.r.err, raw)
    assert.equal("killed", r.r["2"], raw)
    assert.is_nil(r.r["1"], raw)
    assert.equal("killed", r.joiner.err, raw)     -- a task joining it was woken
    assert.equal("killed", r.status, raw)
    -- a short sleep killed: well past its end, the line after it has not run
    r, raw = get(port, "/kill?short:200")
    assert.equal("killed", r.r.err, raw)
    H.sleep(H.T(0.6))
    assert.is_falsy(srv:stdout():find("AFTER SLEEP", 1, true), srv:stdout())
    -- the worker still serves, and a shutdown is not held up by the 10 s sleep
    local t0 = H.now()
    assert.equal(300, get(port, "/join3").c["2"])
    assert.equal(0, srv:stop())
    assert.is_true(H.now() - t0 < H.T(5))
    assert.is_falsy(srv:stdout():find("AFTER SLEEP", 1, true), srv:stdout())
  end)

  it("a task killing itself ends there; kill of a task waiting in join or s:wait cancels that wait", function()
    local r, raw = get(port, "/selfkill")
    assert.equal("killed", r.r.err, raw)
    assert.is_false(r.reached, raw)
    r, raw = get(port, "/kill_waiting")
    assert.equal("killed", r.joiner.err, raw)
    assert.equal("killed", r.semw.err, raw)
    -- the permit posted after the kill went to the live waiter
    assert.same({ ["1"] = true, n = 1 }, r.other, raw)
    assert.equal("killed", r.long, raw)
    assert.equal(0, srv:stop())
  end)

  it("kill of a task waiting in r:cmd (BLPOP) ends it at once; the late reply wakes nothing", function()
    local rport = H.free_port()
    local rs = H.spawn({ REDIS_SERVER, "--port", tostring(rport), "--bind", "127.0.0.1",
      "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", "/tmp", "--loglevel", "warning" })
    H.wait_for(function()
      assert(rs:alive(), "redis-server exited")
      local c = socket.tcp()
      c:settimeout(0.5)
      local ok = c:connect("127.0.0.1", rport)
      c:close()
      return ok
    end, H.T(10), "redis-server")
    local r, raw = get(port, "/redis_kill?" .. rport)
    assert.is_true(r.ms < 100 * H.T(1), raw)
    assert.equal("killed", r.r.err, raw)
    assert.equal("PONG", r.pong, raw)
    H.sleep(H.T(0.2))
    assert.is_falsy(srv:stdout():find("AFTER CMD", 1, true), srv:stdout())
    assert.equal(0, srv:stop())
  end)

  it("a task that errors gives nil, err to join, is logged, and the worker keeps serving", function()
    local r, raw = get(port, "/error")
    assert.equal(2, r.bad.n, raw)
    assert.is_nil(r.bad["1"], raw)
    assert.truthy(r.bad.err:find("task boom", 1, true), raw)
    assert.truthy(r.now_bad.err:find("at once", 1, true), raw)
    assert.same({ ["1"] = "fine", ["2"] = 20, n = 2 }, r.good)
    assert.same({ ["2"] = "soft failure", n = 2, err = "soft failure" }, r.soft)
    srv:wait_stderr("error in task: [^\n]*task boom", H.T(5))
    srv:wait_stderr("error in task: [^\n]*at once", H.T(5))
    assert.equal(300, get(port, "/join3").c["2"])
    assert.equal(0, srv:stop())
  end)

  it("semaphore(2) lets 2 of 5 tasks in at a time, in FIFO order; s:wait(ms) times out", function()
    local r, raw = get(port, "/semaphore")
    assert.equal(2, r.max, raw)
    assert.same({ 1, 2, 3, 4, 5 }, r.order, raw)
    assert.equal(2, r.available, raw)
    r, raw = get(port, "/sem_timeout")
    assert.is_false(r.ok, raw)
    assert.equal("timeout", r.err, raw)
    assert.is_true(r.ms >= 95 and r.ms < 400 * H.T(1), raw)
    assert.is_true(r.ok2, raw)
    assert.equal(0, srv:stop())
  end)

  it("join and wait_any take a timeout; misuse raises with a clear message", function()
    local r, raw = get(port, "/join_timeout")
    assert.is_false(r.r, raw)
    assert.equal("timeout", r.err, raw)
    assert.is_false(r.t2, raw)
    assert.equal("timeout", r.err2, raw)
    assert.is_true(r.ms >= 145 and r.ms < 900 * H.T(1), raw)
    r, raw = get(port, "/misuse")
    assert.truthy(r.not_task:find("mp.join: argument 1 is not a task (number)", 1, true), raw)
    assert.truthy(r.not_fn:find("mp.spawn: a function expected, got string", 1, true), raw)
    assert.truthy(r.sem:find("mp.semaphore: a whole number >= 0 expected", 1, true), raw)
    assert.truthy(r.own_co:find("only inside a moonport callback", 1, true), raw)
    assert.truthy(srv:stdout():find("top join: false mp.join: argument 1 is not a task", 1, true))
    assert.equal(0, srv:stop())
  end)

  it("10,000 tasks on one lane finish, and memory comes back (no growth over rounds)", function()
    -- every lane runs a round first (connections go round robin over the
    -- lanes with -t N), then more rounds must not grow the process
    local lanes = srv.threads or 1
    local kb1 = 0
    for _ = 1, lanes do
      local r, raw = get(port, "/many?10000")
      assert.equal(10000, r.n, raw)
      assert.equal(10000 * 10001 / 2, r.sum, raw)
      kb1 = math.max(kb1, r.kb)
    end
    local rss1 = worker_rss(srv)
    local kb2 = 0
    for _ = 1, 3 * lanes do kb2 = math.max(kb2, get(port, "/many?10000").kb) end
    local rss2 = worker_rss(srv)
    -- the Lua heap after a full collection is back where it was
    assert.is_true(kb2 < kb1 + 256, ("Lua heap %d kB after the first rounds, %d kB later"):format(kb1, kb2))
    -- RSS: not under TSan, whose allocator keeps freed memory (the heap
    -- check above and LSan at exit under ASan still watch for leaks there)
    if not H.bin:find("tsan", 1, true) then
      local slack = 16 * 1024 * (H.sanitized and 4 or 1)
      assert.is_true(rss2 < rss1 + slack, ("RSS %d kB -> %d kB"):format(rss1, rss2))
    end
    assert.equal(0, srv:stop())
  end)
end)
